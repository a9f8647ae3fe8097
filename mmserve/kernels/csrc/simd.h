// 16-lane float vectors (GCC/Clang vector extensions) and loads that widen float32, bfloat16 and
// float16 to them, shared by the kernels. A v16f lowers to one AVX-512 or two AVX2 registers.
#pragma once

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>
#include <cstring>

namespace mmserve_simd {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16u __attribute__((vector_size(32)));
typedef _Float16 v16h __attribute__((vector_size(32)));

constexpr int L = 16;  // lanes

inline v16f splat(float x) { return v16f{} + x; }
inline v16f load(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// 16 bfloat16 -> float: the bits shifted into a float's upper half (exact)
inline v16f load(const c10::BFloat16* p) {
  v16u h;
  std::memcpy(&h, p, sizeof(h));
  return (v16f)(__builtin_convertvector(h, v16i) << 16);
}
// 16 float16 -> float (exact; one vcvtph2ps with F16C)
inline v16f load(const c10::Half* p) {
  v16h h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, v16f);
}
inline void store(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }
template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

inline float hsum(v16f v) {
  float s = 0.f;
  for (int i = 0; i < L; ++i) s += v[i];
  return s;
}

}  // namespace mmserve_simd
