// softmax(q k^T * scale) v of every query over every key (no mask), for bfloat16 q, k, v
// [batch, seq, heads, head_dim] with the last dim contiguous: a vision tower's patches. On AVX-512
// BF16 dot products (vdpbf16ps: two bfloat16 products added into each float32 lane), where
// torch's CPU flash attention ran at 130-180 GFLOP/s against a GEMM rate of about 430.
//
// Each (batch, head) first lays its keys out as [seq / 16][head_dim / 2][16 keys][2] and its
// values as [seq / 2][head_dim rounded up to 16][2] (zeros past the ends). Then each item of 64
// query rows takes 4 rows at a time: their scores over every key in float32 (a 4 x 64-key
// register block), an exact softmax over the row (max, exp, sum in float32; the probabilities
// rounded to bfloat16 for the second product, as torch's flash kernel does), and the outputs as
// a register block of 4 rows x the head dim, divided by the sum and rounded once.
// Needs head_dim even and at most 128; the AVX-512 variant only, on a CPU with avx512_bf16.
#pragma GCC optimize("O3")

#include "ops.h"
#include "paged_attention_kernels.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")

namespace {

constexpr int KEYS = 16;       // keys per score vector
constexpr int ROWS = 4;        // query rows per register block
constexpr int KEY_BLOCK = 4;   // score vectors per register block
constexpr int ROW_TILE = 64;   // query rows per parallel item

struct Shape {
  int64_t seq, seq_pad, dim, dim_pairs, dim_pad;
};

inline __m512bh pair_splat(const uint16_t* p) {  // p[0], p[1] in every lane
  uint32_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(bits));
}
inline __m512bh load_bh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

void pack_keys(const uint16_t* k, int64_t row_stride, const Shape& s, uint16_t* out) {
  for (int64_t j = 0; j < s.seq_pad; ++j) {
    uint16_t* dst = out + (j / KEYS) * s.dim_pairs * 2 * KEYS + (j % KEYS) * 2;
    for (int64_t p = 0; p < s.dim_pairs; ++p) {
      dst[p * 2 * KEYS] = j < s.seq ? k[j * row_stride + 2 * p] : 0;
      dst[p * 2 * KEYS + 1] = j < s.seq ? k[j * row_stride + 2 * p + 1] : 0;
    }
  }
}

void pack_values(const uint16_t* v, int64_t row_stride, const Shape& s, uint16_t* out) {
  std::memset(out, 0, s.seq_pad * s.dim_pad * sizeof(uint16_t));
  for (int64_t j = 0; j < s.seq; ++j) {
    uint16_t* dst = out + (j / 2) * s.dim_pad * 2 + (j % 2);
    for (int64_t d = 0; d < s.dim; ++d) dst[d * 2] = v[j * row_stride + d];
  }
}

// scores[r][16 * (block + i)] for i < NJ: ROWS query rows against NJ vectors of 16 keys.
template <int NJ>
inline void score_block(const uint16_t* const* q, const uint16_t* keys, const Shape& s,
                        int64_t block, float scale, float* const* scores) {
  __m512 acc[ROWS][NJ];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t block_size = s.dim_pairs * 2 * KEYS;
  const uint16_t* base = keys + block * block_size;
  for (int64_t p = 0; p < s.dim_pairs; ++p) {
    __m512bh kv[NJ];
    for (int j = 0; j < NJ; ++j) kv[j] = load_bh(base + j * block_size + p * 2 * KEYS);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh qp = pair_splat(q[r] + 2 * p);
      for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qp, kv[j]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < NJ; ++j)
      _mm512_storeu_ps(scores[r] + (block + j) * KEYS, _mm512_mul_ps(acc[r][j], sc));
}

// One row's probabilities (bfloat16, zero past seq) from its scores; returns 1 / their sum.
inline float softmax_row(float* scores, uint16_t* probs, const Shape& s) {
  using mmserve_simd::vf;
  for (int64_t j = s.seq; j < s.seq_pad; ++j) scores[j] = -std::numeric_limits<float>::infinity();
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < s.seq_pad; j += KEYS) m = _mm512_max_ps(m, _mm512_loadu_ps(scores + j));
  const __m512 row_max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < s.seq_pad; j += KEYS) {
    vf x = (vf)_mm512_sub_ps(_mm512_loadu_ps(scores + j), row_max);
    __m512 e = (__m512)mmserve_attention::vexp(x);
    if (j + KEYS > s.seq) {  // the padded keys: exactly 0
      const __mmask16 live = static_cast<__mmask16>((1u << (s.seq - j)) - 1u);
      e = _mm512_maskz_mov_ps(live, e);
    }
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return 1.0f / _mm512_reduce_add_ps(sum);
}

// out[r] = probs[r] @ values * inv_sum[r] for the first `rows` of R rows, NDV vectors of dims.
template <int R, int NDV>
inline void output_block(const uint16_t* const* probs, const uint16_t* values, const Shape& s,
                         const float* inv_sum, uint16_t* const* out, int rows) {
  __m512 acc[R][NDV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NDV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < s.seq_pad / 2; ++jp) {
    const uint16_t* row = values + jp * s.dim_pad * 2;
    __m512bh vv[NDV];
    for (int v = 0; v < NDV; ++v) vv[v] = load_bh(row + v * 2 * KEYS);
    for (int r = 0; r < R; ++r) {
      const __m512bh pp = pair_splat(probs[r] + 2 * jp);
      for (int v = 0; v < NDV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pp, vv[v]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const __m512 scale = _mm512_set1_ps(inv_sum[r]);
    for (int v = 0; v < NDV; ++v) {
      const int64_t lanes = std::min<int64_t>(KEYS, s.dim - v * KEYS);
      const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][v], scale));
      _mm256_mask_storeu_epi16(out[r] + v * KEYS, mask, (__m256i)h);
    }
  }
}

template <int NDV>
void outputs(const uint16_t* const* probs, const uint16_t* values, const Shape& s,
             const float* inv_sum, uint16_t* const* out, int rows) {
  if constexpr (NDV <= 6) {
    output_block<ROWS, NDV>(probs, values, s, inv_sum, out, rows);
  } else {  // 2 x 8 accumulators, 8 values and a splat fit the 32 registers; 4 x 8 do not
    output_block<2, NDV>(probs, values, s, inv_sum, out, std::min(rows, 2));
    if (rows > 2) output_block<2, NDV>(probs + 2, values, s, inv_sum + 2, out + 2, rows - 2);
  }
}

using OutputFn = void (*)(const uint16_t* const*, const uint16_t*, const Shape&, const float*,
                          uint16_t* const*, int);
OutputFn output_fn(int64_t vectors) {
  switch (vectors) {
    case 1: return outputs<1>;
    case 2: return outputs<2>;
    case 3: return outputs<3>;
    case 4: return outputs<4>;
    case 5: return outputs<5>;
    case 6: return outputs<6>;
    case 7: return outputs<7>;
    default: return outputs<8>;
  }
}

struct Strides {
  int64_t batch, seq, head;
};

void run(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out, int64_t batch,
         int64_t heads, const Shape& s, const Strides qs, const Strides ks, const Strides vs,
         float scale) {
  const int64_t key_size = s.seq_pad * s.dim_pairs * 2, value_size = s.seq_pad * s.dim_pad;
  std::vector<uint16_t> keys(batch * heads * key_size), values(batch * heads * value_size);
  torch::stable::parallel_for(0, batch * heads, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / heads, h = i % heads;
      pack_keys(k + b * ks.batch + h * ks.head, ks.seq, s, keys.data() + i * key_size);
      pack_values(v + b * vs.batch + h * vs.head, vs.seq, s, values.data() + i * value_size);
    }
  });
  const int64_t tiles = (s.seq + ROW_TILE - 1) / ROW_TILE;
  const int64_t blocks = s.seq_pad / KEYS;
  const OutputFn output = output_fn(s.dim_pad / KEYS);
  torch::stable::parallel_for(0, batch * heads * tiles, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> score_rows(ROWS * s.seq_pad);
    std::vector<uint16_t> prob_rows(ROWS * s.seq_pad);
    float* scores[ROWS];
    const uint16_t* probs[ROWS];
    for (int r = 0; r < ROWS; ++r) {
      scores[r] = score_rows.data() + r * s.seq_pad;
      probs[r] = prob_rows.data() + r * s.seq_pad;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t bh = i / tiles, b = bh / heads, h = bh % heads;
      const uint16_t* head_keys = keys.data() + bh * key_size;
      const uint16_t* head_values = values.data() + bh * value_size;
      const int64_t first = (i % tiles) * ROW_TILE, last = std::min(first + ROW_TILE, s.seq);
      for (int64_t row = first; row < last; row += ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(ROWS, last - row));
        const uint16_t* qr[ROWS];
        uint16_t* outr[ROWS];
        for (int r = 0; r < ROWS; ++r) {
          const int64_t t = row + std::min(r, rows - 1);  // a short block repeats its last row
          qr[r] = q + b * qs.batch + t * qs.seq + h * qs.head;
          outr[r] = out + ((b * s.seq + t) * heads + h) * s.dim;
        }
        int64_t block = 0;
        for (; block + KEY_BLOCK <= blocks; block += KEY_BLOCK)
          score_block<KEY_BLOCK>(qr, head_keys, s, block, scale, scores);
        for (; block < blocks; ++block) score_block<1>(qr, head_keys, s, block, scale, scores);
        float inv_sum[ROWS];
        for (int r = 0; r < ROWS; ++r)
          inv_sum[r] = softmax_row(scores[r], prob_rows.data() + r * s.seq_pad, s);
        output(probs, head_values, s, inv_sum, outr, rows);
      }
    }
  });
}

}  // namespace

#pragma GCC pop_options
#endif  // __AVX512F__

Tensor dense_attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  using torch::headeronly::ScalarType;
  MMSERVE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                "q, k and v must be [batch, seq, heads, head_dim]");
  for (const Tensor* t : {&q, &k, &v}) {
    MMSERVE_CHECK(t->is_cpu() && t->scalar_type() == ScalarType::BFloat16 && t->stride(3) == 1,
                  "q, k and v must be bfloat16 CPU tensors with a contiguous last dim");
    for (int i = 0; i < 4; ++i)
      MMSERVE_CHECK(t->size(i) == q.size(i), "q, k and v must have one shape");
  }
  const int64_t batch = q.size(0), seq = q.size(1), heads = q.size(2), dim = q.size(3);
  MMSERVE_CHECK(dim % 2 == 0 && dim >= 2 && dim <= 128, "head_dim must be even and at most 128");
  const Tensor out = mmserve::new_empty(q, {batch, seq, heads, dim});
#if defined(__AVX512F__)
  MMSERVE_CHECK(__builtin_cpu_supports("avx512bf16"), "this CPU has no AVX-512 BF16");
  if (batch * seq * heads == 0) return out;
  const Shape s{seq, (seq + KEYS - 1) / KEYS * KEYS, dim, dim / 2, (dim + KEYS - 1) / KEYS * KEYS};
  const auto strides = [](const Tensor& t) { return Strides{t.stride(0), t.stride(1), t.stride(2)}; };
  const auto bits = [](const Tensor& t) { return static_cast<const uint16_t*>(t.const_data_ptr()); };
  run(bits(q), bits(k), bits(v), static_cast<uint16_t*>(out.mutable_data_ptr()), batch, heads, s,
      strides(q), strides(k), strides(v), static_cast<float>(scale));
  return out;
#else
  (void)scale;
  mmserve::fail("dense_attention_bf16 needs the AVX-512 build of the kernels");
#endif
}
