// The prefill tile of the paged attention kernel (see paged_attention.cpp): up to TILE_ROWS query
// rows of one kv head's group against the sequence's keys, in chunks of PREFILL_KEYS keys with an
// online softmax. Query rows are the vector lanes throughout, so both products are GEMM-like
// register blocks of broadcast-FMAs and the softmax is whole-vector ops:
//   scores  S[t][r] = sum_d Qt[d][r] * K[t][d]     (2 vectors of rows x SCORE_KEYS keys)
//   output  O[r][d] += sum_t P[t][r] * V[t][d]     (OUT_ROWS rows x OUT_VECTORS vectors of dims)
// Each chunk's keys and values are first widened to float into the scratch, so the blocks read
// contiguous float rows whatever the cache's element type.
#pragma once

#include "paged_attention_kernels.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace mmserve_attention {

constexpr int ROW_VECTORS = 2;                    // vectors of rows per register block
constexpr int BLOCK_ROWS = ROW_VECTORS * L;       // query rows per register block
constexpr int SCORE_KEYS = L == 16 ? 12 : 6;      // keys per register block of S
constexpr int OUT_ROWS = 6;                       // query rows per register block of O
constexpr int OUT_VECTORS = L == 16 ? 4 : 2;      // vectors of head dims per block of O (at most)
constexpr int PREFILL_KEYS = 8 * SCORE_KEYS;      // keys per chunk
static_assert(TILE_ROWS % BLOCK_ROWS == 0, "a tile is whole register blocks");

template <int D>
struct PrefillScratch {
  std::vector<float> buf;
  float *qt, *o, *p, *k, *v;
  PrefillScratch()
      : buf(static_cast<size_t>(D) * TILE_ROWS * 2 + (PREFILL_KEYS * (TILE_ROWS + 2 * D))) {
    qt = buf.data();                   // [D][TILE_ROWS]: the tile's scaled queries
    o = qt + D * TILE_ROWS;            // [TILE_ROWS][D]: unnormalized outputs
    p = o + D * TILE_ROWS;             // [PREFILL_KEYS][TILE_ROWS]: scores, then probabilities
    k = p + PREFILL_KEYS * TILE_ROWS;  // [PREFILL_KEYS][D]: the chunk's keys as float
    v = k + PREFILL_KEYS * D;          // [PREFILL_KEYS][D]: its values
  }
};

// Which of a chunk's keys [k0, k0 + n) rows see: row r sits at first_pos + r / group and sees
// keys up to it, so rows [0, r] together see the first keys_up_to(r) keys of the chunk. Blocks
// of rows stop there: the keys past a block's last row are masked, not computed.
struct Diagonal {
  int first_pos, group, k0, n;
  int keys_up_to(int row) const {
    return std::max(0, std::min(n, first_pos + row / group - k0 + 1));
  }
};

// Keys and values [k0, k0 + n) of one kv head, widened to float rows of the scratch; rows up to
// the next multiple of SCORE_KEYS are zero.
template <int D, typename T>
inline void load_chunk(const Args<T>& a, const int32_t* table, int kv_head, int k0, int n,
                       PrefillScratch<D>& s) {
  const int64_t stride = a.num_kv_heads * D;
  int64_t block = k0 / a.block_size, offset = k0 % a.block_size;
  for (int t = 0; t < n; ++t) {
    const int64_t at = (static_cast<int64_t>(table[block]) * a.block_size + offset) * stride +
                       kv_head * D;
    for (int d = 0; d < D; d += L) {
      store(s.k + t * D + d, load(a.k_cache + at + d));
      store(s.v + t * D + d, load(a.v_cache + at + d));
    }
    if (++offset == a.block_size) offset = 0, ++block;
  }
  const int padded = (n + SCORE_KEYS - 1) / SCORE_KEYS * SCORE_KEYS;
  std::fill(s.k + n * D, s.k + padded * D, 0.f);
  std::fill(s.v + n * D, s.v + padded * D, 0.f);
}

// S[t][rows r0..r0+BLOCK_ROWS) for the chunk's keys t < n (whole blocks of SCORE_KEYS).
template <int D>
inline void chunk_scores(const PrefillScratch<D>& s, int r0, int n) {
  for (int t0 = 0; t0 < n; t0 += SCORE_KEYS) {
    vf acc[SCORE_KEYS][ROW_VECTORS] = {};
    const float* kt = s.k + t0 * D;
    for (int d = 0; d < D; ++d) {
      vf q[ROW_VECTORS];
#pragma GCC unroll 4
      for (int j = 0; j < ROW_VECTORS; ++j) q[j] = load(s.qt + d * TILE_ROWS + r0 + j * L);
#pragma GCC unroll 16
      for (int t = 0; t < SCORE_KEYS; ++t) {
        const vf kb = splat(kt[t * D + d]);
#pragma GCC unroll 4
        for (int j = 0; j < ROW_VECTORS; ++j) acc[t][j] += q[j] * kb;
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < SCORE_KEYS; ++t)
#pragma GCC unroll 4
      for (int j = 0; j < ROW_VECTORS; ++j)
        store(s.p + (t0 + t) * TILE_ROWS + r0 + j * L, acc[t][j]);
  }
}

// O[r][:] += sum_{t < n} P[t][r] * V[t][:] for the R rows [r0, r0 + R): R rows x OUT_VECTORS
// vectors of head dims per register block, P broadcast, V loaded.
template <int D, int R>
inline void outputs_rows(const PrefillScratch<D>& s, int r0, int n) {
  constexpr int J = D / L;
  constexpr int JB = divisor_at_most(J, OUT_VECTORS);
  for (int j0 = 0; j0 < J; j0 += JB) {
    vf acc[R][JB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < JB; ++j) acc[r][j] = load(s.o + (r0 + r) * D + (j0 + j) * L);
    const float* pt = s.p + r0;  // pointers, not indices: no index arithmetic per broadcast
    const float* vt = s.v + j0 * L;
    for (int t = 0; t < n; ++t, pt += TILE_ROWS, vt += D) {
      vf v[JB];
#pragma GCC unroll 4
      for (int j = 0; j < JB; ++j) v[j] = load(vt + j * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const vf pb = splat(pt[r]);
#pragma GCC unroll 4
        for (int j = 0; j < JB; ++j) acc[r][j] += pb * v[j];
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < JB; ++j) store(s.o + (r0 + r) * D + (j0 + j) * L, acc[r][j]);
  }
}

// The same for rows [0, rows): blocks of OUT_ROWS, then the rest in one smaller block.
template <int D>
inline void chunk_outputs(const PrefillScratch<D>& s, int rows, const Diagonal& diag) {
  static_assert(OUT_ROWS == 6, "the rest below is 1 to 5 rows");
  int r = 0;
  for (; r + OUT_ROWS <= rows; r += OUT_ROWS)
    outputs_rows<D, OUT_ROWS>(s, r, diag.keys_up_to(r + OUT_ROWS - 1));
  const int n = diag.keys_up_to(rows - 1);
  switch (rows - r) {
    case 5: outputs_rows<D, 5>(s, r, n); break;
    case 4: outputs_rows<D, 4>(s, r, n); break;
    case 3: outputs_rows<D, 3>(s, r, n); break;
    case 2: outputs_rows<D, 2>(s, r, n); break;
    case 1: outputs_rows<D, 1>(s, r, n); break;
    default: break;
  }
}

// The online softmax over one chunk for the row vectors [0, vectors): scores -> probabilities
// in place (masked keys and keys past n -> 0), m and l updated, O rescaled where m grew.
// Row r sees keys up to pos[r] (-1 for padding rows: none).
template <int D>
inline void chunk_softmax(const PrefillScratch<D>& s, int k0, int n, bool masked, const vi* pos,
                          vf* m, vf* l, int vectors) {
  for (int j = 0; j < vectors; ++j) {
    vf mx = splat(NEG_INF);
    for (int t = 0; t < n; ++t) {
      const vf x = load(s.p + t * TILE_ROWS + j * L);
      mx = masked ? ((k0 + t <= pos[j]) & (x > mx) ? x : mx) : (x > mx ? x : mx);
    }
    const vf m_new = mx > m[j] ? mx : m[j];
    const vf corr = m_new == NEG_INF ? splat(1.f) : vexp(m[j] - m_new);
    vf sum{};
    for (int t = 0; t < n; ++t) {
      float* pt = s.p + t * TILE_ROWS + j * L;
      vf e = vexp(load(pt) - m_new);
      if (masked) e = k0 + t <= pos[j] ? e : vf{};
      store(pt, e);
      sum += e;
    }
    l[j] = l[j] * corr + sum;
    m[j] = m_new;
    for (int i = 0; i < L; ++i) {
      if (corr[i] == 1.f) continue;
      const vf c = splat(corr[i]);
      float* o = s.o + (j * L + i) * D;
      for (int d = 0; d < D; d += L) store(o + d, load(o + d) * c);
    }
  }
}

// A tile of up to TILE_ROWS query rows (its positions x the kv head's group of query heads).
template <int D, typename T>
void attend_tile(const Args<T>& a, const WorkItem& w, int group, PrefillScratch<D>& s) {
  constexpr int V = TILE_ROWS / L;
  const int nq = w.q_end - w.q_begin;
  const int rows = nq * group;
  const int blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
  const int vectors = blocks * ROW_VECTORS;
  const int64_t row0 = a.query_start_loc[w.seq] + w.q_begin;
  const int q_len = a.query_start_loc[w.seq + 1] - a.query_start_loc[w.seq];
  const int first_pos = a.seq_lens[w.seq] - q_len + w.q_begin;
  std::fill(s.qt, s.qt + D * TILE_ROWS, 0.f);
  std::fill(s.o, s.o + D * TILE_ROWS, 0.f);
  vi pos[V];
  const T* q_rows[TILE_ROWS];
  for (int r = 0; r < TILE_ROWS; ++r) {
    pos[r / L][r % L] = r < rows ? first_pos + r / group : -1;
    q_rows[r] = a.q + (row0 + r / group) * a.q_row_stride + (w.kv_head * group + r % group) * D;
  }
  const float scale = a.scale;
  for (int d = 0; d < D; ++d) {  // rows inner: contiguous stores (d inner stored 256 B apart)
    float* qt = s.qt + d * TILE_ROWS;
    for (int r = 0; r < rows; ++r) qt[r] = to_float(q_rows[r][d]) * scale;
  }
  vf m[V], l[V];
  for (int j = 0; j < V; ++j) m[j] = splat(NEG_INF), l[j] = vf{};
  const int32_t* table = a.block_tables + w.seq * a.max_blocks;
  const int n_keys = first_pos + nq;
  for (int k0 = 0; k0 < n_keys; k0 += PREFILL_KEYS) {
    const int n = std::min(PREFILL_KEYS, n_keys - k0);
    load_chunk<D, T>(a, table, w.kv_head, k0, n, s);
    const Diagonal diag{first_pos, group, k0, n};
    for (int b = 0; b < blocks; ++b) {
      const int last_row = std::min(rows, (b + 1) * BLOCK_ROWS) - 1;
      chunk_scores<D>(s, b * BLOCK_ROWS, diag.keys_up_to(last_row));
    }
    // the softmax masks the keys past each row (their scores were not computed), so padding
    // rows, whose q is 0, need no mask
    const bool masked = k0 + n - 1 > first_pos;
    chunk_softmax<D>(s, k0, n, masked, pos, m, l, vectors);
    chunk_outputs<D>(s, rows, diag);
  }
  float lsum[TILE_ROWS];
  for (int j = 0; j < V; ++j) store(lsum + j * L, l[j]);
  for (int i = 0; i < nq; ++i) {
    for (int g = 0; g < group; ++g) {
      const int r = i * group + g;
      T* dst = a.out + ((row0 + i) * a.num_heads + w.kv_head * group + g) * D;
      const vf inv = splat(1.f / lsum[r]);
      if constexpr (std::is_same_v<T, float>) {
        for (int d = 0; d < D; d += L) store(dst + d, load(s.o + r * D + d) * inv);
      } else {
        for (int d = 0; d < D; d += L) {
          const vf x = load(s.o + r * D + d) * inv;
          for (int e = 0; e < L; ++e) dst[d + e] = static_cast<T>(x[e]);
        }
      }
    }
  }
}

}  // namespace mmserve_attention
