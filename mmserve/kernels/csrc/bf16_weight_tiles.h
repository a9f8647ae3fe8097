// The packed layout of bfloat16-valued float32 weights, shared by the product
// (bf16_weight_linear.cpp) and the packing (bf16_weight_pack.cpp).
//
// Layout (packed once by mmserve/layers/bf16_weights.py): tiles of TILE = 2W weight rows (W:
// the CPU's float lanes); a tile holds, for each column k, TILE bfloat16 values, where 32-bit
// lane i carries row i in its low half and row W + i in its high half. One vector load then
// gives both halves' rows as floats in two instructions (a shift, an and), and each column of x
// is one broadcast for 2W products: no horizontal sums, the weight read once, front to back.
#pragma once

#include "ops.h"

#include <cstdint>
#include <cstring>

namespace bf16_tiles {

constexpr int W = NATIVE_FLOAT_LANES;
constexpr int TILE = 2 * W;
typedef float vf __attribute__((vector_size(W * 4)));
typedef uint32_t vu __attribute__((vector_size(W * 4)));

// The tile's rows [0, W) and [W, 2W) at one column, as floats.
inline void widen(const uint16_t* p, vf& low, vf& high) {
  vu bits;
  std::memcpy(&bits, p, sizeof(bits));
  low = (vf)(bits << 16);
  high = (vf)(bits & 0xFFFF0000u);
}

}  // namespace bf16_tiles
