#include "ops.h"

// the tensor <-> Python conversions only (half the compile time of torch/extension.h)
#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "causal paged attention over block tables");
  m.def("supported_head_dims", []() { return std::vector<int64_t>{32, 64, 80, 96, 128, 256}; });
  m.def("supported_dtypes", []() {
    return std::vector<std::string>{"float32", "bfloat16", "float16"};
  });
  m.def("rms_norm", &rms_norm, "weight * x / sqrt(mean(x^2) + eps) over the last dim");
  m.def("add_rms_norm", &add_rms_norm, "residual += delta (in place); rms_norm(residual)");
  m.def("small_batch_linear", &small_batch_linear,
        "x @ weight.T + bias for 1 to small_batch_linear_max_rows rows, bfloat16/float16");
  m.attr("small_batch_linear_max_rows") = SMALL_BATCH_LINEAR_MAX_ROWS;
  m.def("rotary_embedding", &rotary_embedding, "RoPE (rotate-half form) on the first heads of each row, in place");
}
