// The paged attention kernel for c10::Half q, caches and output (see paged_attention_launch.h).
#include "paged_attention_launch.h"

namespace mmserve_attention {

template void launch<c10::Half>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                          double, int64_t);

}  // namespace mmserve_attention
