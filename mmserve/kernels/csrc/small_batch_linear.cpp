// y = x @ w.T + bias for a few rows of x (a decode step's tokens, up to MAX_ROWS) in bfloat16 or
// float16: a memory-bound pass over the weights. torch's half-precision matmul streams a
// batch-1 weight at a third of the memory bandwidth; here each weight row is read once, widened
// to float in registers and multiplied into every row of x (kept as float32, converted once per
// call), with float32 accumulators, and each output rounded once to the dtype.
//
// Work: the weight's output rows split evenly across threads; inside a thread ROWS_AT_ONCE
// weight rows at a time (independent accumulators, so the FMAs do not wait on each other).
#pragma GCC optimize("O3")

#include "ops.h"

#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int W = NATIVE_FLOAT_LANES;
typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef uint16_t vu __attribute__((vector_size(W * 2)));
typedef _Float16 vh __attribute__((vector_size(W * 2)));

inline vf widen(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline vf widen(const c10::BFloat16* p) {  // the bits into a float's upper half (exact)
  vu h;
  std::memcpy(&h, p, sizeof(h));
  return (vf)(__builtin_convertvector(h, vi) << 16);
}
inline vf widen(const c10::Half* p) {  // exact; GCC lowers the generic conversion lane by lane
#if defined(__AVX512F__)
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__)
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vh h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, vf);
#endif
}
inline float lanes_sum(vf v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

constexpr int64_t MAX_ROWS = SMALL_BATCH_LINEAR_MAX_ROWS;  // more rows: torch's GEMM
constexpr int64_t GRAIN_ROWS = 64; // weight rows per parallel task, at least

// Rows [begin, end) of out = x @ w.T (+ bias), M rows of x, R weight rows at a time.
template <int M, int R, typename T>
void rows(const float* x, const T* w, const T* bias, T* out, int64_t k_dim, int64_t n_dim,
          int64_t begin, int64_t end) {
  int64_t n = begin;
  for (; n + R <= end; n += R) {
    vf acc[M][R] = {};
    int64_t k = 0;
    for (; k + W <= k_dim; k += W) {
      vf wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = widen(w + (n + r) * k_dim + k);
#pragma GCC unroll 8
      for (int m = 0; m < M; ++m) {
        const vf xv = widen(x + m * k_dim + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[m][r] += wv[r] * xv;
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int r = 0; r < R; ++r) {
        float s = lanes_sum(acc[m][r]);
        const T* wr = w + (n + r) * k_dim;
        for (int64_t kk = k; kk < k_dim; ++kk) s += static_cast<float>(wr[kk]) * x[m * k_dim + kk];
        if (bias != nullptr) s += static_cast<float>(bias[n + r]);
        out[m * n_dim + n + r] = static_cast<T>(s);
      }
    }
  }
  if constexpr (R > 1) {
    if (n < end) rows<M, 1, T>(x, w, bias, out, k_dim, n_dim, n, end);
  }
}

template <int M, typename T>
void run(const float* x, const T* w, const T* bias, T* out, int64_t k_dim, int64_t n_dim) {
  constexpr int R = M == 1 ? 8 : (M == 2 ? 4 : (M <= 4 ? 2 : 1));  // M * R accumulators in registers
  const int64_t threads = std::max<int64_t>(1, torch::stable::get_num_threads());
  const int64_t grain = std::max(GRAIN_ROWS, (n_dim + threads - 1) / threads);
  torch::stable::parallel_for(0, n_dim, grain, [&](int64_t begin, int64_t end) {
    rows<M, R, T>(x, w, bias, out, k_dim, n_dim, begin, end);
  });
}

template <typename T>
void dispatch_rows(int64_t m, const float* x, const T* w, const T* bias, T* out, int64_t k,
                   int64_t n) {
  switch (m) {
    case 1: run<1, T>(x, w, bias, out, k, n); break;
    case 2: run<2, T>(x, w, bias, out, k, n); break;
    case 3: run<3, T>(x, w, bias, out, k, n); break;
    case 4: run<4, T>(x, w, bias, out, k, n); break;
    case 5: run<5, T>(x, w, bias, out, k, n); break;
    case 6: run<6, T>(x, w, bias, out, k, n); break;
    case 7: run<7, T>(x, w, bias, out, k, n); break;
    default: run<8, T>(x, w, bias, out, k, n); break;
  }
}

}  // namespace

Tensor small_batch_linear(const Tensor& x, const Tensor& weight,
                          const std::optional<Tensor>& bias) {
  using torch::headeronly::ScalarType;
  const auto dtype = weight.scalar_type();
  MMSERVE_CHECK(weight.is_cpu() && weight.dim() == 2 && weight.is_contiguous() &&
                    (dtype == ScalarType::BFloat16 || dtype == ScalarType::Half),
                "weight must be a contiguous bfloat16 or float16 CPU tensor [out, in]");
  const int64_t n_dim = weight.size(0), k_dim = weight.size(1);
  MMSERVE_CHECK(x.is_cpu() && x.scalar_type() == dtype && x.dim() == 2 && x.size(1) == k_dim,
                "x must be [rows, in] of the weight's dtype");
  const int64_t m_dim = x.size(0);
  MMSERVE_CHECK(m_dim >= 1 && m_dim <= MAX_ROWS, "x must have 1 to ", MAX_ROWS, " rows");
  MMSERVE_CHECK(!bias.has_value() || (bias->is_cpu() && bias->scalar_type() == dtype &&
                                      bias->is_contiguous() && bias->numel() == n_dim),
                "bias must be contiguous [out] of the weight's dtype");
  std::vector<float> x32(m_dim * k_dim);
  const Tensor xc = mmserve::contiguous(x);
  const Tensor out = mmserve::new_empty(x, {m_dim, n_dim});
  const auto run_type = [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.const_data_ptr<T>();
    for (int64_t i = 0; i < m_dim * k_dim; ++i) x32[i] = static_cast<float>(px[i]);
    const T* pb = bias.has_value() ? bias->const_data_ptr<T>() : nullptr;
    dispatch_rows<T>(m_dim, x32.data(), weight.const_data_ptr<T>(), pb,
                     out.mutable_data_ptr<T>(), k_dim, n_dim);
  };
  if (dtype == ScalarType::BFloat16) {
    run_type(c10::BFloat16{});
  } else {
    run_type(c10::Half{});
  }
  return out;
}
