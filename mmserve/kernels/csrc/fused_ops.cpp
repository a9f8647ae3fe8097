// Fused elementwise ops of the decoder layer: RMSNorm (optionally after the residual add) and
// RoPE on the q and k heads of a fused qkv row in place. Each is one pass over memory instead of torch's 5-6.
//
// Rounding follows transformers' ops where it can: the residual add and RoPE are computed in the
// same order without contraction (bit-identical); RMSNorm differs only in the order in which
// the sum of squares is accumulated.
#include "ops.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>

#include <cmath>

namespace {

constexpr int64_t GRAIN_ROWS = 16;

__attribute__((optimize("fp-contract=off"))) void normalize_row(const float* x, const float* w,
                                                                float* out, int64_t n,
                                                                float eps) {
  float lanes[16] = {};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += x[d + l] * x[d + l];
  }
  float sum = 0.f;
  for (; d < n; ++d) sum += x[d] * x[d];
  for (int w8 = 8; w8 > 0; w8 /= 2) {
    for (int l = 0; l < w8; ++l) lanes[l] += lanes[l + w8];
  }
  sum += lanes[0];
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

__attribute__((optimize("fp-contract=off"))) void add_rows(float* residual, const float* delta,
                                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = residual[i] + delta[i];
}

__attribute__((optimize("fp-contract=off"))) void rotate_heads(float* x, int64_t heads,
                                                               int64_t dim, const float* c,
                                                               const float* s) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* x1 = x + h * dim;
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x1[i], b = x2[i];
      x1[i] = a * c[i] - b * s[i];
      x2[i] = b * c[half + i] + a * s[half + i];
    }
  }
}

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 CPU tensor");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  weight.numel() == x.size(-1),
              "weight must be contiguous float32 with x's last dimension");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  auto out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  const float *px = x.data_ptr<float>(), *pw = weight.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      normalize_row(px + r * n, pw, po + r * n, n, static_cast<float>(eps));
  });
  return out;
}

at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                        double eps) {
  check_rows(residual, weight);
  check_rows(delta, weight);
  TORCH_CHECK(residual.sizes() == delta.sizes(), "residual and delta shapes differ");
  auto out = at::empty_like(residual);
  const int64_t n = residual.size(-1), rows = residual.numel() / std::max<int64_t>(n, 1);
  float* pr = residual.data_ptr<float>();
  const float *pd = delta.data_ptr<float>(), *pw = weight.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      add_rows(pr + r * n, pd + r * n, n);
      normalize_row(pr + r * n, pw, po + r * n, n, static_cast<float>(eps));
    }
  });
  return out;
}

void rotary_embedding(at::Tensor& x, int64_t heads, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 2,
              "x must be a contiguous float32 CPU tensor [tokens, width]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.dim() == 2 &&
                  cos.sizes() == sin.sizes() && cos.size(0) == x.size(0),
              "cos and sin must be contiguous float32 [tokens, head_dim]");
  const int64_t tokens = x.size(0), width = x.size(1), dim = cos.size(1);
  TORCH_CHECK(dim % 2 == 0 && heads >= 0 && heads * dim <= width,
              "heads * head_dim exceeds the row width");
  float* px = x.data_ptr<float>();
  const float *pc = cos.data_ptr<float>(), *ps = sin.data_ptr<float>();
  at::parallel_for(0, tokens, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      rotate_heads(px + t * width, heads, dim, pc + t * dim, ps + t * dim);
  });
}
