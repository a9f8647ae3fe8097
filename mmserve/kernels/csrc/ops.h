// mmserve's CPU kernels (float32, bfloat16 or float16; contiguous tensors, float32 arithmetic);
// bound to Python in module.cpp.
#pragma once

// ATen's tensor alone: torch/extension.h (the whole C++ frontend) takes 10x as long to compile.
#include <ATen/core/Tensor.h>

#include <optional>

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                           double scale, int64_t block_size);

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                        double eps);

void rotary_embedding(at::Tensor& x, int64_t heads, const at::Tensor& cos, const at::Tensor& sin);

// The most rows of x small_batch_linear takes (a decode step's tokens).
constexpr int64_t SMALL_BATCH_LINEAR_MAX_ROWS = 8;

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias);
