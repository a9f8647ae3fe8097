// y = x @ w.T + bias for bfloat16 x [rows, in] and w [out, in], on AVX-512 BF16 dot products
// (vdpbf16ps: two bfloat16 products added into each float32 lane), float32 sums, each output
// rounded once to bfloat16. One layout serves a decode step's few rows at the memory's read
// rate and a prefill's many at the rate of oneDNN's prepacked product.
//
// Layout (packed once by mmserve/layers/bf16_dot_weights.py): the weight's rows in blocks of 16
// (zeros past the last row); a block holds, for each pair of columns (2j, 2j + 1), its 16 rows'
// two values side by side: [out / 16][in / 2][16][2], one 64-byte vector per pair. A vector
// times x's pair (2j, 2j + 1) broadcast to every lane adds both products into the 16 rows'
// sums: no horizontal sums, and a block is one stream read front to back.
//
// Work: panels of a few blocks split across threads. Up to DECODE_ROWS rows of x take every
// column in one pass with all their sums in registers (rows x blocks at a time from a table), and
// ask for each block's vectors a kilobyte ahead, since they come from memory. More rows go
// PREFILL_ROWS at a time against PREFILL_BLOCKS blocks, in groups of ROW_GROUP rows and
// K_PAIRS column pairs, so that the panel's share of the weight stays in L2 while the group's
// rows pass it; partial sums wait in a per-task buffer between column blocks.
// Needs in even; the AVX-512 variant only, on a CPU with avx512_bf16.
#pragma GCC optimize("O3")

#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")

namespace {

constexpr int BLOCK = 16;            // weight rows (outputs) per block: one float32 vector
constexpr int64_t PAIR_VALUES = 32;  // bfloat16 values per column pair of a block
constexpr int64_t AHEAD = 16 * PAIR_VALUES;  // decode: a kilobyte ahead in each block's stream
constexpr int PREFILL_ROWS = 4, PREFILL_BLOCKS = 6;  // 24 sums + 6 weight vectors in registers
constexpr int64_t ROW_GROUP = 128;
constexpr int64_t K_PAIRS = 512;

struct Problem {
  const uint16_t* x;
  int64_t x_stride;  // elements between rows of x
  const uint16_t* w;
  int64_t pairs;   // in / 2
  int64_t blocks;  // ceil(out / 16)
  const uint16_t* bias;
  uint16_t* out;
  int64_t n;  // out
};

// acc[m][b] += rows m of x times blocks b of the panel at `block`, over pairs [p0, p1).
template <int R, int NB, bool AHEAD_READS>
inline void accumulate(const Problem& s, int64_t row, int64_t block, int64_t p0, int64_t p1,
                       __m512 (&acc)[R][NB]) {
  const uint16_t* w = s.w + block * s.pairs * PAIR_VALUES;
  const uint16_t* x = s.x + row * s.x_stride;
  for (int64_t p = p0; p < p1; ++p) {
    __m512i wv[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) {
      const uint16_t* wp = w + (b * s.pairs + p) * PAIR_VALUES;
      if constexpr (AHEAD_READS) _mm_prefetch(reinterpret_cast<const char*>(wp + AHEAD), _MM_HINT_T0);
      wv[b] = _mm512_loadu_si512(wp);
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * s.x_stride + 2 * p, sizeof(pair));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], (__m512bh)wv[b], xv);
    }
  }
}

// out[row + m, block's columns] = acc[m][b] + bias, rounded to bfloat16 (the columns that exist).
template <int R, int NB>
inline void store(const Problem& s, int64_t row, int64_t block, const __m512 (&acc)[R][NB]) {
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) {
    const int64_t col = (block + b) * BLOCK;
    const int64_t valid = std::min<int64_t>(BLOCK, s.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    __m512 bias = _mm512_setzero_ps();
    if (s.bias != nullptr) {
      const __m256i bits = _mm256_maskz_loadu_epi16(mask, s.bias + col);
      bias = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
    for (int m = 0; m < R; ++m) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_add_ps(acc[m][b], bias));
      _mm256_mask_storeu_epi16(s.out + (row + m) * s.n + col, mask, (__m256i)y);
    }
  }
}

// Every row (R of them) against blocks [block, block + NB) over every column: a decode step.
template <int R, int NB>
void decode_panel(const Problem& s, int64_t block) {
  __m512 acc[R][NB];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  accumulate<R, NB, true>(s, 0, block, 0, s.pairs, acc);
  store<R, NB>(s, 0, block, acc);
}

// Rows [row, row + R) against blocks [block, block + NB) over pairs [p0, p1): sums from and to
// `partial` ([ROW_GROUP][PREFILL_BLOCKS][16], this task's), except on the first and last block
// of pairs (zeros in; the rounded outputs out).
template <int R, int NB>
void prefill_part(const Problem& s, int64_t row, int64_t block, int64_t p0, int64_t p1,
                  float* partial) {
  __m512 acc[R][NB];
  for (int m = 0; m < R; ++m)
    for (int b = 0; b < NB; ++b)
      acc[m][b] = p0 == 0 ? _mm512_setzero_ps()
                          : _mm512_loadu_ps(partial + (m * PREFILL_BLOCKS + b) * BLOCK);
  accumulate<R, NB, false>(s, row, block, p0, p1, acc);
  if (p1 == s.pairs) {
    store<R, NB>(s, row, block, acc);
    return;
  }
  for (int m = 0; m < R; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(partial + (m * PREFILL_BLOCKS + b) * BLOCK, acc[m][b]);
}

// The panel at the end of the weight may have fewer than NB blocks: its instance for nb.
template <int R, int NB>
void decode_blocks(const Problem& s, int64_t block, int64_t nb) {
  if constexpr (NB > 1) {
    if (nb < NB) return decode_blocks<R, NB - 1>(s, block, nb);
  }
  decode_panel<R, NB>(s, block);
}

template <int R, int NB>
void prefill_blocks(const Problem& s, int64_t row, int64_t block, int64_t nb, int64_t p0,
                    int64_t p1, float* partial) {
  if constexpr (NB > 1) {
    if (nb < NB) return prefill_blocks<R, NB - 1>(s, row, block, nb, p0, p1, partial);
  }
  prefill_part<R, NB>(s, row, block, p0, p1, partial);
}

// Decode: R rows of x against DECODE_BLOCKS[R] blocks at a time (R x that sums and that many
// weight vectors in the 32 registers).
constexpr int DECODE_ROWS = 8;
constexpr int DECODE_BLOCKS[DECODE_ROWS + 1] = {0, 8, 8, 6, 6, 4, 4, 3, 3};

template <int R>
void decode(const Problem& s) {
  constexpr int NB = DECODE_BLOCKS[R];
  const int64_t panels = (s.blocks + NB - 1) / NB;
  const int64_t threads = std::max<int64_t>(1, torch::stable::get_num_threads());
  torch::stable::parallel_for(0, panels, (panels + threads - 1) / threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t block = t * NB;
      decode_blocks<R, NB>(s, block, s.blocks - block);
    }
  });
}

template <int R>
inline void prefill_rows(const Problem& s, int64_t rows, int64_t row, int64_t block, int64_t nb,
                         int64_t p0, int64_t p1, float* partial) {
  if constexpr (R > 1) {
    if (rows < R) return prefill_rows<R - 1>(s, rows, row, block, nb, p0, p1, partial);
  }
  prefill_blocks<R, PREFILL_BLOCKS>(s, row, block, nb, p0, p1, partial);
}

void prefill(const Problem& s, int64_t m_dim) {
  const int64_t panels = (s.blocks + PREFILL_BLOCKS - 1) / PREFILL_BLOCKS;
  const int64_t groups = (m_dim + ROW_GROUP - 1) / ROW_GROUP;
  const int64_t tasks = panels * groups;  // a thread's tasks: whole panels, one after another
  const int64_t threads = std::max<int64_t>(1, torch::stable::get_num_threads());
  const bool blocked = s.pairs > K_PAIRS;
  torch::stable::parallel_for(0, tasks, (tasks + threads - 1) / threads, [&](int64_t t0, int64_t t1) {
    std::vector<float> partial(blocked ? ROW_GROUP * PREFILL_BLOCKS * BLOCK : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t block = (t / groups) * PREFILL_BLOCKS;
      const int64_t nb = std::min<int64_t>(PREFILL_BLOCKS, s.blocks - block);
      const int64_t r0 = (t % groups) * ROW_GROUP, r1 = std::min(m_dim, r0 + ROW_GROUP);
      for (int64_t p0 = 0; p0 < s.pairs; p0 += K_PAIRS) {
        const int64_t p1 = std::min(s.pairs, p0 + K_PAIRS);
        for (int64_t row = r0; row < r1; row += PREFILL_ROWS) {
          float* at = blocked ? partial.data() + (row - r0) * PREFILL_BLOCKS * BLOCK : nullptr;
          prefill_rows<PREFILL_ROWS>(s, std::min<int64_t>(PREFILL_ROWS, r1 - row), row, block, nb,
                                     p0, p1, at);
        }
      }
    }
  });
}

void run(const Problem& s, int64_t m_dim) {
  switch (m_dim) {
    case 1: return decode<1>(s);
    case 2: return decode<2>(s);
    case 3: return decode<3>(s);
    case 4: return decode<4>(s);
    case 5: return decode<5>(s);
    case 6: return decode<6>(s);
    case 7: return decode<7>(s);
    case 8: return decode<8>(s);
    default: return prefill(s, m_dim);
  }
}

}  // namespace

#pragma GCC pop_options
#endif

Tensor bf16_dot_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                       int64_t n) {
  using torch::headeronly::ScalarType;
  MMSERVE_CHECK(packed.is_cpu() && packed.scalar_type() == ScalarType::BFloat16 &&
                    packed.dim() == 3 && packed.size(2) == 32 && packed.is_contiguous(),
                "packed must be a contiguous bfloat16 CPU tensor [out / 16, in / 2, 32]");
  const int64_t blocks = packed.size(0), pairs = packed.size(1);
  MMSERVE_CHECK(n > (blocks - 1) * 16 && n <= blocks * 16, "n must be the weight's ", blocks,
                " blocks of 16 rows (", (blocks - 1) * 16 + 1, " to ", blocks * 16, "), not ", n);
  MMSERVE_CHECK(x.is_cpu() && x.scalar_type() == ScalarType::BFloat16 && x.dim() == 2 &&
                    x.size(1) == 2 * pairs,
                "x must be a bfloat16 CPU tensor [rows, ", 2 * pairs, "]");
  MMSERVE_CHECK(!bias.has_value() || (bias->is_cpu() && bias->scalar_type() == ScalarType::BFloat16 &&
                                      bias->is_contiguous() && bias->numel() == n),
                "bias must be a contiguous bfloat16 CPU tensor [", n, "]");
  const int64_t m_dim = x.size(0);
  const Tensor xc = x.stride(1) == 1 ? x : torch::stable::contiguous(x);  // rows read in pairs
  const Tensor out = mmserve::new_empty(x, {m_dim, n});
#if defined(__AVX512F__)
  MMSERVE_CHECK(__builtin_cpu_supports("avx512bf16"), "this CPU has no AVX-512 BF16");
  if (m_dim == 0) return out;
  const auto bits = [](const Tensor& t) { return static_cast<const uint16_t*>(t.const_data_ptr()); };
  const Problem s{bits(xc),  m_dim == 1 ? 2 * pairs : xc.stride(0),
                  bits(packed), pairs, blocks, bias.has_value() ? bits(*bias) : nullptr,
                  static_cast<uint16_t*>(out.mutable_data_ptr()), n};
  run(s, m_dim);
  return out;
#else
  mmserve::fail("bf16_dot_linear needs the AVX-512 build of the kernels");
#endif
}
