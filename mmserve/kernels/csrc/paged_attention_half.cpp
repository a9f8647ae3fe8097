// The paged attention kernel for c10::Half q, caches and output (see paged_attention_launch.h).
#include "paged_attention_launch.h"

namespace mmserve_attention {

template bool launch<c10::Half>(const Args<c10::Half>&, int64_t, int64_t);

}  // namespace mmserve_attention
