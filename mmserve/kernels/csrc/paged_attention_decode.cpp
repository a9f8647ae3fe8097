// The decode loops of the paged attention kernel for every head dim and element type, compiled
// at -O3 (the package's other sources build at -O2; see paged_attention_launch.h).
#pragma GCC optimize("O3")

#include "paged_attention_kernels.h"

namespace mmserve_attention {

// The largest lane, by halving with shuffles (lane i against lane i ^ h; a loop over the lanes
// went through the stack).
inline float hmax(vf v) {
  const vi ids = lane_ids();
#pragma GCC unroll 4
  for (int h = L / 2; h >= 1; h /= 2) {
    const vf w = __builtin_shuffle(v, ids ^ h);
    v = v > w ? v : w;
  }
  return v[0];
}

// The selector of one step of sum_tree: pairs of vectors (a, b) -> the sums of their blocks of
// C lanes, a's blocks first; lane i of the result takes block i / C of the two, its first (HI:
// its second) half.
template <int C, bool HI>
inline vi pair_selector() {
  constexpr int per_vector = L / (2 * C);  // blocks of the result from each of a, b
  vi m;
  for (int i = 0; i < L; ++i) {
    const int block = i / C;
    m[i] = (block >= per_vector ? L : 0) + (block % per_vector) * 2 * C + i % C + (HI ? C : 0);
  }
  return m;
}

// The steps from C down to 1: the 2C vectors a[0, 2C) become a[0]; lane t of it is the sum of
// the lanes of the original a[t] (a shuffle tree: L - 1 pairs of shuffles, not L horizontal
// sums).
template <int C>
inline void sum_tree(vf* a) {
  const vi lo = pair_selector<C, false>(), hi = pair_selector<C, true>();
  for (int i = 0; i < C; ++i)
    a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) +
           __builtin_shuffle(a[2 * i], a[2 * i + 1], hi);
  if constexpr (C > 1) sum_tree<C / 2>(a);
}

// One decode (a single query position): its group's few rows, one dot product per key.
template <int D, typename T>
void attend_decode(const Args<T>& a, const WorkItem& w, int group, Scratch<D>& s) {
  const int64_t row = a.query_start_loc[w.seq];
  const int n_keys = a.seq_lens[w.seq];
  float* q = s.qt;  // [rows][D]
  for (int g = 0; g < group; ++g) {
    const T* src = a.q + row * a.q_row_stride + (w.kv_head * group + g) * D;
    for (int d = 0; d < D; ++d) q[g * D + d] = to_float(src[d]) * a.scale;
  }
  std::fill(s.acc, s.acc + group * D, 0.f);
  float m[TILE_ROWS], l[TILE_ROWS];
  std::fill(m, m + group, NEG_INF);
  std::fill(l, l + group, 0.f);
  const int32_t* table = a.block_tables + w.seq * a.max_blocks;
  KeyChunk<T> c;
  for (int k0 = 0; k0 < n_keys; k0 += KC) {
    gather_pointers<D, T>(a, table, w.kv_head, k0, std::min(KC, n_keys - k0), s.zeros, c);
    for (int g = 0; g < group; ++g) {
      vf partial[KC] = {};  // KC independent sums: one query load for KC keys
      for (int d = 0; d < D; d += L) {
        const vf qv = load(q + g * D + d);
        for (int t = 0; t < KC; ++t) partial[t] += qv * load(c.k[t] + d);
      }
      sum_tree<L / 2>(partial);  // partial[0]: the chunk's scores
      const vf x = lane_ids() < c.n ? partial[0] : splat(NEG_INF);
      const float m_new = std::max(m[g], hmax(x));
      const float corr = m[g] == NEG_INF ? 0.f : std::exp(m[g] - m_new);
      const vf e = x == NEG_INF ? vf{} : vexp(x - m_new);
      l[g] = l[g] * corr + hsum(e);
      m[g] = m_new;
      store(s.p + g * KC, e);  // the row's probabilities, [row][key]: one store
      if (corr != 1.f) {
        for (int d = 0; d < D; ++d) s.acc[g * D + d] *= corr;
      }
    }
    accumulate_pv<D, T>(c, s.p, 1, KC, s.acc, group);
  }
  write_out<D, T>(a, w, group, s.acc, l);
}

#define MMSERVE_DEFINE_DECODE(D, T) template MMSERVE_DECODE_INSTANCE(D, T)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, float)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, c10::BFloat16)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_DEFINE_DECODE, c10::Half)

}  // namespace mmserve_attention
