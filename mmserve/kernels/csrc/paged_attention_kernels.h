// Inner loops of the paged attention kernel (see paged_attention.cpp), on simd.h's vectors: one
// prefill tile (scores and softmax vectorized across query rows), one decode. Templated on the
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
constexpr int TILE_ROWS = 32; // query rows (positions x heads of a kv group) per prefill item
constexpr int RB = 4;         // rows per register block in P @ V
constexpr int TG = KC < 8 ? KC : 8;  // keys per register block in Q @ K^T
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

// A tile of up to TILE_ROWS query rows: scores and softmax vectorized across rows.
template <int D, typename T>
void attend_tile(const Args<T>& a, const WorkItem& w, int group, Scratch<D>& s) {
  constexpr int V = TILE_ROWS / L;
  const int nq = w.q_end - w.q_begin;
  const int rows = nq * group;
  const int64_t row0 = a.query_start_loc[w.seq] + w.q_begin;
  const int q_len = a.query_start_loc[w.seq + 1] - a.query_start_loc[w.seq];
  const int first_pos = a.seq_lens[w.seq] - q_len + w.q_begin;
  std::fill(s.qt, s.qt + D * TILE_ROWS, 0.f);
  std::fill(s.acc, s.acc + D * TILE_ROWS, 0.f);
  vi pos[V];
  for (int r = 0; r < TILE_ROWS; ++r) {
    pos[r / L][r % L] = r < rows ? first_pos + r / group : -1;
    if (r >= rows) continue;
    const T* src =
        a.q + (row0 + r / group) * a.q_row_stride + (w.kv_head * group + r % group) * D;
    for (int d = 0; d < D; ++d) s.qt[d * TILE_ROWS + r] = to_float(src[d]) * a.scale;
  }
  vf m[V], l[V];
  for (int j = 0; j < V; ++j) m[j] = splat(NEG_INF), l[j] = vf{};
  const int32_t* table = a.block_tables + w.seq * a.max_blocks;
  const int n_keys = first_pos + nq;
  KeyChunk<T> c;
  for (int k0 = 0; k0 < n_keys; k0 += KC) {
    gather_pointers<D, T>(a, table, w.kv_head, k0, std::min(KC, n_keys - k0), s.zeros, c);
    for (int t0 = 0; t0 < KC; t0 += TG) {
      vf sc[TG][V] = {};
      for (int d = 0; d < D; ++d) {
        vf qv[V];
        for (int j = 0; j < V; ++j) qv[j] = load(s.qt + d * TILE_ROWS + j * L);
        for (int t = 0; t < TG; ++t) {
          const float kv = to_float(c.k[t0 + t][d]);
          for (int j = 0; j < V; ++j) sc[t][j] += qv[j] * kv;
        }
      }
      for (int t = 0; t < TG; ++t)
        for (int j = 0; j < V; ++j) store(s.p + (t0 + t) * TILE_ROWS + j * L, sc[t][j]);
    }
    for (int j = 0; j < V; ++j) {
      vf mx = splat(NEG_INF);
      for (int t = 0; t < c.n; ++t) {
        const vf x = load(s.p + t * TILE_ROWS + j * L);
        mx = (k0 + t <= pos[j]) & (x > mx) ? x : mx;
      }
      const vf m_new = mx > m[j] ? mx : m[j];
      const vf corr = m_new == NEG_INF ? splat(1.f) : vexp(m[j] - m_new);
      vf sum{};
      for (int t = 0; t < KC; ++t) {
        float* pt = s.p + t * TILE_ROWS + j * L;
        if (t >= c.n) {
          store(pt, vf{});
          continue;
        }
        const vf e = k0 + t <= pos[j] ? vexp(load(pt) - m_new) : vf{};
        store(pt, e);
        sum += e;
      }
      l[j] = l[j] * corr + sum;
      m[j] = m_new;
      for (int i = 0; i < L; ++i) {
        if (corr[i] == 1.f) continue;
        float* acc = s.acc + (j * L + i) * D;
        for (int d = 0; d < D; ++d) acc[d] *= corr[i];
      }
    }
    accumulate_pv<D, T>(c, s.p, TILE_ROWS, 1, s.acc, rows);
  }
  float lsum[TILE_ROWS];
  for (int j = 0; j < V; ++j) store(lsum + j * L, l[j]);
  write_out<D, T>(a, w, group, s.acc, lsum);
}

// One decode (a single query position): its group's few rows, one dot product per key;
// defined in paged_attention_decode.cpp, the one file that compiles it (at -O3).
template <int D, typename T>
void attend_decode(const Args<T>& a, const WorkItem& w, int group, Scratch<D>& s);

}  // namespace mmserve_attention
