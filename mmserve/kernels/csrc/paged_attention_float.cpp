// The paged attention kernel for float q, caches and output (see paged_attention_launch.h).
#include "paged_attention_launch.h"

namespace mmserve_attention {

template void launch<float>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                          double, int64_t);

}  // namespace mmserve_attention
