// mmserve's CPU kernels (float32, bfloat16 or float16; contiguous tensors, float32 arithmetic),
// on torch's stable ABI (torch::stable::Tensor, a handle into libtorch's C shim; why:
// docs/devices.md). Registered as torch ops in module.cpp.
#pragma once

#include "simd.h"

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using torch::stable::Tensor;

namespace mmserve {

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  throw std::runtime_error(message.str());
}

// A contiguous uninitialized tensor of `like`'s dtype and device: one call into libtorch's C
// shim. torch::stable::new_empty looks aten::new_empty up by name on each call (~3.5 us more).
inline Tensor new_empty(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  int32_t dtype = 0, device_type = 0, device_index = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(like.get(), &dtype));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle out = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()),
                                                         sizes.data(), strides.data(), dtype,
                                                         device_type, device_index, &out));
  return Tensor(out);
}

// t itself when contiguous (torch::stable::contiguous is a dispatcher call, ~1 us, even then)
inline Tensor contiguous(const Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

}  // namespace mmserve

// A failed argument check: a RuntimeError in Python with the message alone (STD_TORCH_CHECK
// would prefix it with the function, file and line).
#define MMSERVE_CHECK(cond, ...)                  \
  do {                                            \
    if (!(cond)) ::mmserve::fail(__VA_ARGS__);    \
  } while (0)

Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& block_tables, const Tensor& query_start_loc,
                       const Tensor& seq_lens, double scale, int64_t block_size);

// The head dims paged_attention is built for (MMSERVE_FOR_EACH_HEAD_DIM).
std::vector<int64_t> supported_head_dims();

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);

Tensor add_rms_norm(const Tensor& residual, const Tensor& delta, const Tensor& weight,
                    double eps);

void rotary_embedding(const Tensor& x, int64_t heads, const Tensor& cos, const Tensor& sin);
// The vision towers' RoPE of x [tokens, heads, head_dim] in float32 (cos [tokens, head_dim], sin
// [tokens, head_dim / 2]), rounded once to x's dtype: a new contiguous tensor (fused_ops.cpp).
Tensor rotary_embedding_float(const Tensor& x, const Tensor& cos, const Tensor& sin);

// The most rows of x small_batch_linear takes (a decode step's tokens).
constexpr int64_t SMALL_BATCH_LINEAR_MAX_ROWS = 8;

Tensor small_batch_linear(const Tensor& x, const Tensor& weight,
                          const std::optional<Tensor>& bias);

Tensor bf16_weight_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                          int64_t n);
int64_t bf16_weight_pack(const Tensor& weight, const Tensor& out);
void bf16_weight_unpack(const Tensor& packed, const Tensor& out);
int64_t bf16_weight_tile_rows();

// bfloat16 x @ w.T + bias, w packed in column pairs for AVX-512 BF16 dot products
// [out / 16, in / 2, 32] (bf16_dot_linear.cpp); n = out. A new [rows, n] tensor.
Tensor bf16_dot_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                       int64_t n);

// softmax(q k^T * scale) v over every key, bfloat16 [batch, seq, heads, head_dim] (the last dim
// contiguous; head_dim even, at most 128), on AVX-512 BF16 (dense_attention_bf16.cpp).
Tensor dense_attention_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
