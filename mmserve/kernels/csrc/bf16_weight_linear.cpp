// y = x @ w.T + bias in float32, where w is a float32 weight whose values are all bfloat16
// values (a bfloat16 checkpoint served in float32), kept as its bfloat16 bits: half the bytes a
// float32 weight takes, and the same products, since widening a bfloat16 to float32 is exact.
// Every product and sum is float32.
//
// Layout: bf16_weight_tiles.h.
//
// Work: the tiles split evenly across threads; inside a tile, x's columns go in blocks of
// K_BLOCK, so that the tile's block stays in L1 while rows of x pass it. Up to 8 rows (a decode
// step) keep their accumulators on the stack, at most 4 rows per pass over a block (2 x 4
// accumulators + 2 weight vectors + 1 broadcast fit AVX2's 16 registers); one or two rows
// accumulate even and odd columns apart, so that enough FMAs are in flight. More rows (prefill)
// are first copied into panels of MR rows laid out column by column, so that a pass reads its
// MR broadcasts from one cache line; every tile then passes M_BLOCK rows' panels at a time with
// the accumulators in a per-thread buffer, while those rows stay in L2.
// Measured against oneDNN's packed float32 product: layers/bf16_weights.py.
#pragma GCC optimize("O3")

#include "bf16_weight_tiles.h"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using bf16_tiles::TILE;
using bf16_tiles::vf;
using bf16_tiles::W;
using bf16_tiles::widen;
constexpr int64_t K_BLOCK = 256;
// Decode reads each weight once, from memory: a pass asks for the tile's next block while it
// computes this one, every other column (a cache line on AVX2). A whole block ahead was the
// best of 64 to 512 columns; against no prefetching, medians of alternated runs on 2 AVX2
// threads read 1.0-1.3x the bytes per second at 1 row and 1.1-1.6x at 4 rows. (A check of
// each column for its turn, in both loops, lost that gain.)
inline void prefetch_ahead(const uint16_t* tile, int64_t k) {
  __builtin_prefetch(tile + (k + K_BLOCK) * TILE, 0, 0);
}

// Rows of x per micro-kernel pass when there are many: 2 x MR accumulators, 2 weight vectors
// and a broadcast fit the vector registers (16 below AVX-512, 32 with it).
constexpr int MR = W == 16 ? 12 : 6;
constexpr int64_t M_BLOCK = MR * (128 / MR);  // rows of x per pass of the weight
// acc[M0 + p] += tile[k0:k1] * x[M0 + p, k0:k1] for p < P.
template <int P>
inline void pass(const uint16_t* tile, const float* x, int64_t k_dim, int m0, int64_t k0,
                 int64_t k1, vf (*acc)[2]) {
  vf a[P][2], b[P][2] = {};
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    a[p][0] = acc[m0 + p][0];
    a[p][1] = acc[m0 + p][1];
  }
  int64_t k = k0;
  if constexpr (P <= 2) {  // two independent chains per accumulator
    for (; k + 2 <= k1; k += 2) {
      vf low0, high0, low1, high1;
      prefetch_ahead(tile, k);
      widen(tile + k * TILE, low0, high0);
      widen(tile + (k + 1) * TILE, low1, high1);
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        const float* xr = x + (m0 + p) * k_dim + k;
        a[p][0] += low0 * xr[0];
        a[p][1] += high0 * xr[0];
        b[p][0] += low1 * xr[1];
        b[p][1] += high1 * xr[1];
      }
    }
  }
  for (; k < k1; ++k) {
    vf low, high;
    if (k % 2 == 0) prefetch_ahead(tile, k);
    widen(tile + k * TILE, low, high);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const float xv = x[(m0 + p) * k_dim + k];
      a[p][0] += low * xv;
      a[p][1] += high * xv;
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    acc[m0 + p][0] = a[p][0] + b[p][0];
    acc[m0 + p][1] = a[p][1] + b[p][1];
  }
}

// out[m, n] = acc[m] (+ bias[n]) for the tile's rows n that exist (the last tile's padding not):
// two vector stores a row for a whole tile (one store per value cost a prefill of 768-wide
// inputs about a tenth of its time).
inline void store(const vf (*acc)[2], int64_t m_dim, int64_t t, const float* bias, float* out,
                  int64_t n_dim) {
  const int64_t n0 = t * TILE;
  if (n0 + TILE <= n_dim) {
    vf b[2] = {};
    if (bias != nullptr) std::memcpy(b, bias + n0, sizeof(b));
    for (int64_t m = 0; m < m_dim; ++m) {
      vf row[2] = {acc[m][0], acc[m][1]};
      if (bias != nullptr) row[0] += b[0], row[1] += b[1];
      std::memcpy(out + m * n_dim + n0, row, sizeof(row));
    }
    return;
  }
  for (int64_t m = 0; m < m_dim; ++m) {
    for (int i = 0; i < TILE && t * TILE + i < n_dim; ++i) {
      const int64_t n = t * TILE + i;
      const float s = acc[m][i / W][i % W];
      out[m * n_dim + n] = bias == nullptr ? s : s + bias[n];
    }
  }
}

template <int M>
void run(const float* x, const uint16_t* packed, const float* bias, float* out, int64_t k_dim,
         int64_t n_dim) {
  const int64_t tiles = (n_dim + TILE - 1) / TILE;
  const int64_t threads = std::max<int64_t>(1, torch::stable::get_num_threads());
  torch::stable::parallel_for(0, tiles, (tiles + threads - 1) / threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* tile = packed + t * k_dim * TILE;
      vf acc[M][2] = {};
      for (int64_t k0 = 0; k0 < k_dim; k0 += K_BLOCK) {
        const int64_t k1 = std::min(k_dim, k0 + K_BLOCK);
        pass<std::min(M, 4)>(tile, x, k_dim, 0, k0, k1, acc);
        if constexpr (M > 4) pass<M - 4>(tile, x, k_dim, 4, k0, k1, acc);
      }
      store(acc, M, t, bias, out, n_dim);
    }
  });
}

// acc[0, MR) += tile[k0:k1] * panel[k0:k1], the panel being MR rows of x packed column by
// column ([k][MR]): one weight load and MR broadcasts, all from L1, per 2 x MR FMAs. Every 8
// columns it prefetches the same columns of the panel that passes next (`next`) into L1, and
// the first pass over a block (FIRST) the tile's next block into L2: without them each pass
// waited for its panel from L2 and each block's first pass for its weights from memory
// (medians of alternated runs, 2 AVX2 threads, the Qwen2-VL-2B shape's LM at 144 rows and
// its vision tower at 256: 117-124 -> 137-146 and 111-123 -> 133-138 GFLOP/s, where the
// pass alone in L1 ran 128-154 and the FMA units 182-185).
constexpr int64_t PREFETCH_K = 8;
// acc[0, MR) += tile[k] * panel[k] for one column k.
inline void panel_step(const uint16_t* tile, const float* panel, int64_t k, vf (*a)[2]) {
  vf low, high;
  widen(tile + k * TILE, low, high);
  const float* xk = panel + k * MR;
#pragma GCC unroll 12
  for (int p = 0; p < MR; ++p) {
    a[p][0] += low * xk[p];
    a[p][1] += high * xk[p];
  }
}

template <bool FIRST>
inline void panel_pass(const uint16_t* tile, const float* panel, const float* next, int64_t k0,
                       int64_t k1, vf (*acc)[2]) {
  vf a[MR][2];
#pragma GCC unroll 12
  for (int p = 0; p < MR; ++p) {
    a[p][0] = acc[p][0];
    a[p][1] = acc[p][1];
  }
  int64_t k = k0;
  for (; k + PREFETCH_K <= k1; k += PREFETCH_K) {
    const char* x_ahead = reinterpret_cast<const char*>(next + k * MR);
#pragma GCC unroll 8
    for (int64_t b = 0; b < PREFETCH_K * MR * 4; b += 64) __builtin_prefetch(x_ahead + b, 0, 3);
    if constexpr (FIRST) {
      const char* w_ahead = reinterpret_cast<const char*>(tile + (k + K_BLOCK) * TILE);
#pragma GCC unroll 8
      for (int64_t b = 0; b < PREFETCH_K * TILE * 2; b += 64) __builtin_prefetch(w_ahead + b, 0, 2);
    }
#pragma GCC unroll 8
    for (int64_t j = 0; j < PREFETCH_K; ++j) panel_step(tile, panel, k + j, a);
  }
  for (; k < k1; ++k) panel_step(tile, panel, k, a);
#pragma GCC unroll 12
  for (int p = 0; p < MR; ++p) {
    acc[p][0] = a[p][0];
    acc[p][1] = a[p][1];
  }
}

// Any number of rows: x packed in panels of MR rows (the last padded with zeros), then, M_BLOCK
// rows at a time, every tile passes the block's panels with the accumulators in a per-thread
// buffer.
void run_many(const float* x, const uint16_t* packed, const float* bias, float* out,
              int64_t m_dim, int64_t k_dim, int64_t n_dim) {
  const int64_t tiles = (n_dim + TILE - 1) / TILE;
  const int64_t panels = (m_dim + MR - 1) / MR;
  const int64_t threads = std::max<int64_t>(1, torch::stable::get_num_threads());
  std::vector<float> xp(panels * k_dim * MR);
  torch::stable::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* panel = xp.data() + p * k_dim * MR;
      for (int r = 0; r < MR; ++r) {
        const int64_t m = p * MR + r;
        for (int64_t k = 0; k < k_dim; ++k) panel[k * MR + r] = m < m_dim ? x[m * k_dim + k] : 0.f;
      }
    }
  });
  for (int64_t m0 = 0; m0 < m_dim; m0 += M_BLOCK) {
    const int64_t rows = std::min(M_BLOCK, m_dim - m0);
    const int64_t block_panels = (rows + MR - 1) / MR;
    torch::stable::parallel_for(0, tiles, (tiles + threads - 1) / threads, [&](int64_t t0, int64_t t1) {
      std::vector<vf> buffer(block_panels * MR * 2);
      vf (*acc)[2] = reinterpret_cast<vf (*)[2]>(buffer.data());
      for (int64_t t = t0; t < t1; ++t) {
        const uint16_t* tile = packed + t * k_dim * TILE;
        std::fill(buffer.begin(), buffer.end(), vf{});
        for (int64_t k0 = 0; k0 < k_dim; k0 += K_BLOCK) {
          const int64_t k1 = std::min(k_dim, k0 + K_BLOCK);
          const float* first = xp.data() + (m0 / MR) * k_dim * MR;
          for (int64_t p = 0; p < block_panels; ++p) {
            const float* panel = first + p * k_dim * MR;
            // after the block's last panel comes its first, at the next block's columns
            const float* next = p + 1 < block_panels ? panel + k_dim * MR : first + K_BLOCK * MR;
            if (p == 0) {
              panel_pass<true>(tile, panel, next, k0, k1, acc);
            } else {
              panel_pass<false>(tile, panel, next, k0, k1, acc + p * MR);
            }
          }
        }
        store(acc, rows, t, bias, out + m0 * n_dim, n_dim);
      }
    });
  }
}

}  // namespace

Tensor bf16_weight_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                          int64_t n_dim) {
  using torch::headeronly::ScalarType;
  MMSERVE_CHECK(packed.is_cpu() && packed.dim() == 3 && packed.is_contiguous() &&
                    packed.scalar_type() == ScalarType::BFloat16 && packed.size(2) == TILE &&
                    packed.size(0) * TILE >= n_dim && (packed.size(0) - 1) * TILE < n_dim,
                "packed must be a contiguous bfloat16 CPU tensor [tiles, in, ", TILE,
                "] packed for n rows");
  const int64_t k_dim = packed.size(1);
  MMSERVE_CHECK(x.is_cpu() && x.scalar_type() == ScalarType::Float && x.dim() == 2 &&
                    x.size(1) == k_dim && x.size(0) >= 1,
                "x must be float32 [rows, in]");
  MMSERVE_CHECK(!bias.has_value() || (bias->is_cpu() && bias->scalar_type() == ScalarType::Float &&
                                      bias->is_contiguous() && bias->numel() == n_dim),
                "bias must be contiguous float32 [n]");
  const Tensor xc = mmserve::contiguous(x);
  const Tensor out = mmserve::new_empty(xc, {x.size(0), n_dim});
  const float* px = xc.const_data_ptr<float>();
  const auto* pw = reinterpret_cast<const uint16_t*>(packed.const_data_ptr());
  const float* pb = bias.has_value() ? bias->const_data_ptr<float>() : nullptr;
  float* po = out.mutable_data_ptr<float>();
  switch (x.size(0)) {
    case 1: run<1>(px, pw, pb, po, k_dim, n_dim); break;
    case 2: run<2>(px, pw, pb, po, k_dim, n_dim); break;
    case 3: run<3>(px, pw, pb, po, k_dim, n_dim); break;
    case 4: run<4>(px, pw, pb, po, k_dim, n_dim); break;
    case 5: run<5>(px, pw, pb, po, k_dim, n_dim); break;
    case 6: run<6>(px, pw, pb, po, k_dim, n_dim); break;
    case 7: run<7>(px, pw, pb, po, k_dim, n_dim); break;
    case 8: run<8>(px, pw, pb, po, k_dim, n_dim); break;
    default: run_many(px, pw, pb, po, x.size(0), k_dim, n_dim);
  }
  return out;
}
