// Float vectors of the CPU's native width (GCC/Clang vector extensions), and loads that widen
// float32, bfloat16 and float16 to them, shared by the attention kernels. A vector wider than the
// target's registers is lowered through the stack: the decode loop on 16-lane vectors made about
// 2,600 stack accesses on AVX2.
#pragma once

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>
#include <cstring>

// The CPU's native float lanes per vector register.
#if defined(__AVX512F__)
constexpr int NATIVE_FLOAT_LANES = 16;
#elif defined(__AVX__)
constexpr int NATIVE_FLOAT_LANES = 8;
#else
constexpr int NATIVE_FLOAT_LANES = 4;
#endif

namespace mmserve_simd {

constexpr int L = NATIVE_FLOAT_LANES;  // lanes

typedef float vf __attribute__((vector_size(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L)));
typedef uint16_t vu __attribute__((vector_size(2 * L)));
typedef _Float16 vh __attribute__((vector_size(2 * L)));

// x in every lane: one vbroadcastss. Not `vf{} + x`: 0 + x is not x for x = -0, so that form
// costs an add before the broadcast; and a loop over the lanes compiled at -O3 to a chain of
// vinsertps. x - 0 is x for every x, so the subtraction folds away.
inline vf splat(float x) { return x - vf{}; }
inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// L bfloat16 -> float: the bits shifted into a float's upper half (exact)
inline vf load(const c10::BFloat16* p) {
  vu h;
  std::memcpy(&h, p, sizeof(h));
  return (vf)(__builtin_convertvector(h, vi) << 16);
}
// L float16 -> float (exact; one vcvtph2ps with F16C)
inline vf load(const c10::Half* p) {
  vh h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, vf);
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

// Lane i holds i.
inline vi lane_ids() {
  vi v;
  for (int i = 0; i < L; ++i) v[i] = i;
  return v;
}

inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < L; ++i) s += v[i];
  return s;
}

}  // namespace mmserve_simd
