// The decode loops of the paged attention kernel for every head dim and element type, compiled
// at -O3 (the package's other sources build at -O2; see paged_attention_launch.h).
#pragma GCC optimize("O3")

#include "paged_attention_kernels.h"

namespace mmserve_attention {

constexpr v16i LANES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// The largest lane, by halving with shuffles (a loop over the lanes went through the stack).
inline float hmax(v16f v) {
  constexpr v16i h8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
  constexpr v16i h4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
  constexpr v16i h2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
  constexpr v16i h1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
  v16f w = __builtin_shuffle(v, h8);
  v = v > w ? v : w;
  w = __builtin_shuffle(v, h4);
  v = v > w ? v : w;
  w = __builtin_shuffle(v, h2);
  v = v > w ? v : w;
  w = __builtin_shuffle(v, h1);
  v = v > w ? v : w;
  return v[0];
}

// Sums of 16 vectors at once: lane t of the result is the sum of a[t]'s lanes (a shuffle tree:
// 15 pairs of shuffles instead of 16 horizontal sums).
inline v16f sum16x16(v16f* a) {
  static const v16i lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  static const v16i hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  static const v16i lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  static const v16i hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  static const v16i lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  static const v16i hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  static const v16i even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  static const v16i odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  for (int i = 0; i < 8; ++i)
    a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo8) +
           __builtin_shuffle(a[2 * i], a[2 * i + 1], hi8);
  for (int i = 0; i < 4; ++i)
    a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo4) +
           __builtin_shuffle(a[2 * i], a[2 * i + 1], hi4);
  for (int i = 0; i < 2; ++i)
    a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo2) +
           __builtin_shuffle(a[2 * i], a[2 * i + 1], hi2);
  return __builtin_shuffle(a[0], a[1], even) + __builtin_shuffle(a[0], a[1], odd);
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
      v16f partial[KC];
      for (int t = 0; t < KC; ++t) {
        partial[t] = v16f{};
        for (int d = 0; d < D; d += L) partial[t] += load(q + g * D + d) * load(c.k[t] + d);
      }
      const v16f x = LANES < c.n ? sum16x16(partial) : splat(NEG_INF);
      const float m_new = std::max(m[g], hmax(x));
      const float corr = m[g] == NEG_INF ? 0.f : std::exp(m[g] - m_new);
      const v16f e = x == NEG_INF ? v16f{} : exp16(x - m_new);
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
