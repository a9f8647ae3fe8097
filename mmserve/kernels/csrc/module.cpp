// The kernels as torch ops of the library's namespace, torch.ops.<MMSERVE_OPS_NAMESPACE>
// (setup.py defines it per variant, mmserve_<variant>, so variants loaded into one process do not
// clash), registered through torch's stable ABI when mmserve/kernels/__init__.py loads the
// library (torch.ops.load_library). Why the stable ABI, not pybind11: docs/devices.md.
#include "ops.h"

#include <torch/csrc/stable/library.h>

#include <string>
#include <vector>

#ifndef MMSERVE_OPS_NAMESPACE
#error "MMSERVE_OPS_NAMESPACE (the torch.ops namespace) is defined by setup.py"
#endif

namespace {

std::vector<std::string> supported_dtypes() { return {"float32", "bfloat16", "float16"}; }

int64_t small_batch_linear_max_rows() { return SMALL_BATCH_LINEAR_MAX_ROWS; }

}  // namespace

STABLE_TORCH_LIBRARY(MMSERVE_OPS_NAMESPACE, m) {
  // causal paged attention over block tables (paged_attention.cpp)
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, float scale, int block_size) -> Tensor");
  m.def("supported_head_dims() -> int[]");
  m.def("supported_dtypes() -> str[]");
  // weight * x / sqrt(mean(x^2) + eps) over the last dim
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  // residual += delta (in place); rms_norm(residual)
  m.def("add_rms_norm(Tensor(a!) residual, Tensor delta, Tensor weight, float eps) -> Tensor");
  // RoPE (rotate-half form) on the first heads of each row, in place
  m.def("rotary_embedding(Tensor(a!) x, int heads, Tensor cos, Tensor sin) -> ()");
  // the vision towers' RoPE in float32, rounded once: a new [tokens, heads, head_dim] tensor
  m.def("rotary_embedding_float(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  // x @ weight.T + bias for 1 to small_batch_linear_max_rows() rows, bfloat16/float16
  m.def("small_batch_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("small_batch_linear_max_rows() -> int");
  // float32 x @ w.T + bias, w kept as bfloat16 tiles (bf16_weight_linear.cpp)
  m.def("bf16_weight_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
  // a float32 weight's bfloat16 bits into tiles (bf16_weight_pack.cpp); how many values were
  // not bfloat16 values
  m.def("bf16_weight_pack(Tensor weight, Tensor(a!) out) -> int");
  // the tiles widened back to float32 and transposed: [in, tiles x tile]
  m.def("bf16_weight_unpack(Tensor packed, Tensor(a!) out) -> ()");
  m.def("bf16_weight_tile_rows() -> int");
  // bfloat16 x @ w.T + bias, w in column pairs [out / 16, in / 2, 32] (bf16_dot_linear.cpp)
  m.def("bf16_dot_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
  // attention over every key for bfloat16 [batch, seq, heads, head_dim] (dense_attention_bf16.cpp)
  m.def("dense_attention_bf16(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(MMSERVE_OPS_NAMESPACE, CPU, m) {
  m.impl("paged_attention", TORCH_BOX(&paged_attention));
  m.impl("rms_norm", TORCH_BOX(&rms_norm));
  m.impl("add_rms_norm", TORCH_BOX(&add_rms_norm));
  m.impl("rotary_embedding", TORCH_BOX(&rotary_embedding));
  m.impl("rotary_embedding_float", TORCH_BOX(&rotary_embedding_float));
  m.impl("small_batch_linear", TORCH_BOX(&small_batch_linear));
  m.impl("bf16_weight_linear", TORCH_BOX(&bf16_weight_linear));
  m.impl("bf16_weight_pack", TORCH_BOX(&bf16_weight_pack));
  m.impl("bf16_weight_unpack", TORCH_BOX(&bf16_weight_unpack));
  m.impl("dense_attention_bf16", TORCH_BOX(&dense_attention_bf16));
  m.impl("bf16_dot_linear", TORCH_BOX(&bf16_dot_linear));
}

// the ops without a tensor argument, which no device key dispatches
STABLE_TORCH_LIBRARY_IMPL(MMSERVE_OPS_NAMESPACE, CompositeExplicitAutograd, m) {
  m.impl("supported_head_dims", TORCH_BOX(&supported_head_dims));
  m.impl("supported_dtypes", TORCH_BOX(&supported_dtypes));
  m.impl("small_batch_linear_max_rows", TORCH_BOX(&small_batch_linear_max_rows));
  m.impl("bf16_weight_tile_rows", TORCH_BOX(&bf16_weight_tile_rows));
}
