// The paged attention kernel for float q, caches and output (see paged_attention_launch.h).
#include "paged_attention_launch.h"

namespace mmserve_attention {

template bool launch<float>(const Args<float>&, int64_t, int64_t);

}  // namespace mmserve_attention
