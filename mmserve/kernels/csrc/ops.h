// mmserve's CPU kernels (float32, contiguous tensors); bound to Python in module.cpp.
#pragma once

#include <torch/extension.h>

torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                              const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                              const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens,
                              double scale, int64_t block_size);

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

torch::Tensor add_rms_norm(torch::Tensor& residual, const torch::Tensor& delta,
                           const torch::Tensor& weight, double eps);

void rotary_embedding(torch::Tensor& x, int64_t heads, const torch::Tensor& cos,
                      const torch::Tensor& sin);
