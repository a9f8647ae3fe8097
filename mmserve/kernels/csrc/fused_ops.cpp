// Fused elementwise ops of the decoder layer: RMSNorm (optionally after the residual add) and
// RoPE on the q and k heads of a fused qkv row in place. Each is one pass over memory instead of torch's 5-6.
// And the vision towers' RoPE, computed in float32 and rounded once (rotary_embedding_float).
//
// float32, bfloat16 or float16 (every tensor of a call in one dtype but the float32 tables of
// rotary_embedding_float). Rounding follows
// transformers' ops where it can: the residual add and RoPE are computed in the same order
// without contraction, each torch op's result rounded to the dtype as torch rounds it
// (bit-identical); RMSNorm accumulates in float32 and differs only in the order in which the
// sum of squares is accumulated; as HF's LlamaRMSNorm it rounds the normalized row to the dtype
// before the weight multiplies it.
#include "ops.h"

#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cmath>

using torch::headeronly::ScalarType;
using torch::stable::parallel_for;

namespace {

constexpr int64_t GRAIN_ROWS = 16;

// x rounded to T as one torch op of dtype T rounds its float result (identity for float)
template <typename T>
inline float rnd(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T>
__attribute__((optimize("fp-contract=off"))) void normalize_row(const T* x, const T* w, T* out,
                                                                int64_t n, float eps) {
  float lanes[16] = {};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    for (int l = 0; l < 16; ++l) {
      const float v = static_cast<float>(x[d + l]);
      lanes[l] += v * v;
    }
  }
  float sum = 0.f;
  for (; d < n; ++d) sum += static_cast<float>(x[d]) * static_cast<float>(x[d]);
  for (int w8 = 8; w8 > 0; w8 /= 2) {
    for (int l = 0; l < w8; ++l) lanes[l] += lanes[l + w8];
  }
  sum += lanes[0];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(static_cast<float>(w[i]) * rnd<T>(static_cast<float>(x[i]) * inv));
}

template <typename T>
__attribute__((optimize("fp-contract=off"))) void add_rows(T* residual, const T* delta,
                                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    residual[i] = static_cast<T>(static_cast<float>(residual[i]) + static_cast<float>(delta[i]));
}

// x * cos + rotate_half(x) * sin, each product and the sum rounded to T as torch rounds them
template <typename T>
__attribute__((optimize("fp-contract=off"))) void rotate_heads(T* x, int64_t heads, int64_t dim,
                                                               const T* c, const T* s) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* x1 = x + h * dim;
    T* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(x1[i]), b = static_cast<float>(x2[i]);
      const float c1 = static_cast<float>(c[i]), s1 = static_cast<float>(s[i]);
      const float c2 = static_cast<float>(c[half + i]), s2 = static_cast<float>(s[half + i]);
      x1[i] = static_cast<T>(rnd<T>(a * c1) - rnd<T>(b * s1));
      x2[i] = static_cast<T>(rnd<T>(b * c2) + rnd<T>(a * s2));
    }
  }
}

// The vision towers' RoPE: widened to float32, x * cos + rotate_half(x) * sin in float32 (each
// product and the sum rounded as torch's float32 ops round them), then rounded once to T, as
// transformers' apply_rotary_pos_emb_vision does. s holds one half of the sin table (its two
// halves are equal). Not inlined: inlined into the caller, GCC contracted it into FMAs.
template <typename T>
__attribute__((noinline, optimize("fp-contract=off"))) void rotate_head_float(
    const T* x, T* out, int64_t half, const float* c, const float* s) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = static_cast<float>(x[i]), b = static_cast<float>(x[half + i]);
    out[i] = static_cast<T>(a * c[i] - b * s[i]);
    out[half + i] = static_cast<T>(b * c[half + i] + a * s[i]);
  }
}

bool supported(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::BFloat16 || t == ScalarType::Half;
}

void check_rows(const Tensor& x, const Tensor& weight) {
  MMSERVE_CHECK(x.is_cpu() && supported(x.scalar_type()) && x.is_contiguous() && x.dim() >= 1,
                "x must be a contiguous float32, bfloat16 or float16 CPU tensor");
  MMSERVE_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() &&
                    weight.numel() == x.size(-1),
                "weight must be contiguous, of x's dtype and x's last dimension");
}

// f<T>() for the float type of `t`
template <typename F>
void dispatch(ScalarType t, F&& f) {
  if (t == ScalarType::Float) {
    f(float{});
  } else if (t == ScalarType::BFloat16) {
    f(c10::BFloat16{});
  } else {
    f(c10::Half{});
  }
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_rows(x, weight);
  const Tensor out = mmserve::new_empty(x, x.sizes());  // x is contiguous: so is out
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  dispatch(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    const T *px = x.const_data_ptr<T>(), *pw = weight.const_data_ptr<T>();
    T* po = out.mutable_data_ptr<T>();
    parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        normalize_row(px + r * n, pw, po + r * n, n, static_cast<float>(eps));
    });
  });
  return out;
}

Tensor add_rms_norm(const Tensor& residual, const Tensor& delta, const Tensor& weight,
                    double eps) {
  check_rows(residual, weight);
  check_rows(delta, weight);
  MMSERVE_CHECK(residual.sizes() == delta.sizes(), "residual and delta shapes differ");
  const Tensor out = mmserve::new_empty(residual, residual.sizes());
  const int64_t n = residual.size(-1), rows = residual.numel() / std::max<int64_t>(n, 1);
  dispatch(residual.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    T* pr = residual.mutable_data_ptr<T>();
    const T *pd = delta.const_data_ptr<T>(), *pw = weight.const_data_ptr<T>();
    T* po = out.mutable_data_ptr<T>();
    parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        add_rows(pr + r * n, pd + r * n, n);
        normalize_row(pr + r * n, pw, po + r * n, n, static_cast<float>(eps));
      }
    });
  });
  return out;
}

void rotary_embedding(const Tensor& x, int64_t heads, const Tensor& cos, const Tensor& sin) {
  MMSERVE_CHECK(x.is_cpu() && supported(x.scalar_type()) && x.is_contiguous() && x.dim() == 2,
                "x must be a contiguous float32, bfloat16 or float16 CPU tensor [tokens, width]");
  MMSERVE_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
                    cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 &&
                    cos.sizes() == sin.sizes() && cos.size(0) == x.size(0),
                "cos and sin must be contiguous [tokens, head_dim] of x's dtype");
  const int64_t tokens = x.size(0), width = x.size(1), dim = cos.size(1);
  MMSERVE_CHECK(dim % 2 == 0 && heads >= 0 && heads * dim <= width,
                "heads * head_dim exceeds the row width");
  dispatch(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    T* px = x.mutable_data_ptr<T>();
    const T *pc = cos.const_data_ptr<T>(), *ps = sin.const_data_ptr<T>();
    parallel_for(0, tokens, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        rotate_heads(px + t * width, heads, dim, pc + t * dim, ps + t * dim);
    });
  });
}

Tensor rotary_embedding_float(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  MMSERVE_CHECK(x.is_cpu() && supported(x.scalar_type()) && x.dim() == 3 && x.stride(2) == 1,
                "x must be a float32, bfloat16 or float16 CPU tensor [tokens, heads, head_dim] "
                "with a contiguous last dim");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  MMSERVE_CHECK(cos.scalar_type() == ScalarType::Float && sin.scalar_type() == ScalarType::Float &&
                    cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 &&
                    sin.dim() == 2 && cos.size(0) == tokens && sin.size(0) == tokens &&
                    cos.size(1) == dim && sin.size(1) == half && dim % 2 == 0,
                "cos must be float32 [tokens, head_dim] and sin float32 [tokens, head_dim / 2]");
  const Tensor out = mmserve::new_empty(x, {tokens, heads, dim});
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  dispatch(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.const_data_ptr<T>();
    T* po = out.mutable_data_ptr<T>();
    const float *pc = cos.const_data_ptr<float>(), *ps = sin.const_data_ptr<float>();
    parallel_for(0, tokens, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < heads; ++h)
          rotate_head_float(px + t * token_stride + h * head_stride,
                            po + (t * heads + h) * dim, half, pc + t * dim, ps + t * half);
    });
  });
  return out;
}
