// The paged attention kernel for c10::BFloat16 q, caches and output (see paged_attention_launch.h).
#include "paged_attention_launch.h"

namespace mmserve_attention {

template bool launch<c10::BFloat16>(const Args<c10::BFloat16>&, int64_t, int64_t);

}  // namespace mmserve_attention
