// The decode loops of the paged attention kernel for every head dim and element type, compiled
// at -O3 (the package's other sources build at -O2; see paged_attention_launch.h).
#pragma GCC optimize("O3")

#include "paged_attention_kernels.h"

namespace mmserve_attention {

#define MMSERVE_DEFINE_DECODE(D, T) template MMSERVE_DECODE_INSTANCE(D, T)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, float)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, c10::BFloat16)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, c10::Half)

}  // namespace mmserve_attention
