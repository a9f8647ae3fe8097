// Inner loops of the paged attention kernel (see paged_attention.cpp), on simd.h's vectors: what
// a decode needs (the prefill tile is paged_attention_prefill.h's). Templated on the
// element type T of q, the caches and out (float, c10::BFloat16, c10::Half): K/V are widened to
// float as they are loaded, every score, softmax and accumulator is float, out is rounded once.
#pragma once

#include "simd.h"

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace mmserve_attention {

using namespace mmserve_simd;

// The head dims the kernel is built for (paged_attention_launch.h dispatches on them).
#define MMSERVE_FOR_EACH_HEAD_DIM(X, T) X(32, T) X(64, T) X(80, T) X(96, T) X(128, T) X(256, T)
#define MMSERVE_DECODE_INSTANCE(D, T) \
  void attend_decode<D, T>(const Args<T>&, const WorkItem&, int, Scratch<D>&);

constexpr int KC = L;         // keys per chunk: one vector of scores
constexpr int TILE_ROWS = 64; // query rows (positions x heads of a kv group) per prefill item
constexpr int RB = 4;         // rows per register block in P @ V
constexpr float EXP_FLOOR = -87.3f;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

template <typename T>
struct Args {
  const T* q;
  const T* k_cache;
  const T* v_cache;
  T* out;
  const int32_t* block_tables;
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  int64_t max_blocks;
  int64_t block_size;
  int64_t num_heads;
  int64_t num_kv_heads;
  float scale;
  int64_t q_row_stride;
};

struct WorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t q_begin;  // query positions [q_begin, q_end) of the sequence's scheduled ones
  int32_t q_end;
  int64_t cost;
};

// exp(x) for softmax arguments (x <= 0): Cephes' expf polynomial, about 1 ulp.
inline vf vexp(vf x) {
  x = x < EXP_FLOOR ? splat(EXP_FLOOR) : x;
  const vf t = x * 1.44269504088896341f + 0.5f;
  vf fx = __builtin_convertvector(__builtin_convertvector(t, vi), vf);
  fx = fx > t ? fx - 1.0f : fx;  // floor (truncation rounds negatives up)
  const vf r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  vf y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const vi bits = (__builtin_convertvector(fx, vi) + 127) << 23;
  return y * (vf)bits;  // same-size vector cast: a bit cast
}

template <typename T>
struct KeyChunk {
  const T* k[KC];
  const T* v[KC];
  int n;
};

// Pointers to keys [k0, k0 + n) of one kv head, read in place through the block table; slots
// past n point at a zero row so full-width loops need no bounds checks (zero bits are zero in
// every element type, so the float zero row serves them all).
template <int D, typename T>
inline void gather_pointers(const Args<T>& a, const int32_t* table, int kv_head, int k0, int n,
                            const float* zeros, KeyChunk<T>& c) {
  const int64_t stride = a.num_kv_heads * D;
  c.n = n;
  int64_t block = k0 / a.block_size, offset = k0 % a.block_size;  // one division per chunk
  for (int t = 0; t < KC; ++t) {
    if (t < n) {
      const int64_t slot = static_cast<int64_t>(table[block]) * a.block_size + offset;
      c.k[t] = a.k_cache + slot * stride + kv_head * D;
      c.v[t] = a.v_cache + slot * stride + kv_head * D;
      if (++offset == a.block_size) offset = 0, ++block;
    } else {
      c.k[t] = c.v[t] = reinterpret_cast<const T*>(zeros);
    }
  }
}

// The largest divisor of n not above limit (1 at least).
constexpr int divisor_at_most(int n, int limit) {
  for (int d = limit < n ? limit : n; d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

// acc[r] += sum_t p[t * t_stride + r * r_stride] * V[t] for the R rows [r0, r0 + R), JB vectors
// of the head dim at a time: R x JB accumulators and JB values of V fit the vector registers
// (16 below AVX-512, 32 with it), so none is kept on the stack.
template <int D, typename T, int R>
inline void accumulate_rows(const KeyChunk<T>& c, const float* p, int t_stride, int r_stride,
                            float* acc, int r0) {
  constexpr int J = D / L;
  constexpr int JB = divisor_at_most(J, (L == 16 ? 28 : 13) / (R + 1));
  for (int j0 = 0; j0 < J; j0 += JB) {
    vf o[R][JB];
    for (int rr = 0; rr < R; ++rr)
      for (int j = 0; j < JB; ++j) o[rr][j] = load(acc + (r0 + rr) * D + (j0 + j) * L);
    for (int t = 0; t < c.n; ++t) {
      vf vv[JB];
      for (int j = 0; j < JB; ++j) vv[j] = load(c.v[t] + (j0 + j) * L);
      for (int rr = 0; rr < R; ++rr) {
        const vf pr = splat(p[t * t_stride + (r0 + rr) * r_stride]);
        for (int j = 0; j < JB; ++j) o[rr][j] += pr * vv[j];
      }
    }
    for (int rr = 0; rr < R; ++rr)
      for (int j = 0; j < JB; ++j) store(acc + (r0 + rr) * D + (j0 + j) * L, o[rr][j]);
  }
}

// The same for rows [0, rows): blocks of RB rows, then the rest in one smaller block (a decode
// with 2 query heads per kv head used to compute 4 rows, 2 of them zeros).
template <int D, typename T>
inline void accumulate_pv(const KeyChunk<T>& c, const float* p, int t_stride, int r_stride,
                          float* acc, int rows) {
  static_assert(RB == 4, "the rest below is 1 to 3 rows");
  int r = 0;
  for (; r + RB <= rows; r += RB) accumulate_rows<D, T, RB>(c, p, t_stride, r_stride, acc, r);
  switch (rows - r) {
    case 3: accumulate_rows<D, T, 3>(c, p, t_stride, r_stride, acc, r); break;
    case 2: accumulate_rows<D, T, 2>(c, p, t_stride, r_stride, acc, r); break;
    case 1: accumulate_rows<D, T, 1>(c, p, t_stride, r_stride, acc, r); break;
    default: break;
  }
}

template <int D>
struct Scratch {
  std::vector<float> buf;
  float *qt, *acc, *p, *zeros;
  Scratch() : buf(static_cast<size_t>(D) * TILE_ROWS * 2 + KC * TILE_ROWS + D) {
    qt = buf.data();               // [D][TILE_ROWS]: the tile's queries, rows as lanes
    acc = qt + D * TILE_ROWS;      // [TILE_ROWS][D]
    p = acc + D * TILE_ROWS;       // [KC][TILE_ROWS]: scores, then probabilities
    zeros = p + KC * TILE_ROWS;    // [D]
  }
};

template <int D, typename T>
void write_out(const Args<T>& a, const WorkItem& w, int group, const float* acc, const float* l) {
  const int64_t row0 = a.query_start_loc[w.seq] + w.q_begin;
  for (int i = 0; i < w.q_end - w.q_begin; ++i) {
    for (int g = 0; g < group; ++g) {
      const int r = i * group + g;
      T* dst = a.out + ((row0 + i) * a.num_heads + w.kv_head * group + g) * D;
      const float inv = 1.f / l[r];
      for (int d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[r * D + d] * inv);
    }
  }
}

// One decode (a single query position): its group's few rows, one dot product per key;
// defined in paged_attention_decode.cpp, the one file that compiles it (at -O3).
template <int D, typename T>
void attend_decode(const Args<T>& a, const WorkItem& w, int group, Scratch<D>& s);

}  // namespace mmserve_attention
