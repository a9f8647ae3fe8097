// The host side of the paged attention kernel (see paged_attention.cpp): the work plan, its
// binning across threads and the per-head-dim dispatch, for one element type. Each element
// type is compiled in its own file (paged_attention_<type>.cpp) so the three compile in
// parallel; paged_attention.cpp sees only the declarations below, checks the tensors and passes
// raw pointers (Args).
#pragma once

#include "paged_attention_prefill.h"

#include <torch/csrc/stable/ops.h>  // parallel_for

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace mmserve_attention {

// One decode per (head dim, element type), compiled at -O3 in paged_attention_decode.cpp (at
// -O2 a decode runs 1.7-2.5x slower; the prefill tiles are as fast at -O2 and compile 3x faster).
#define MMSERVE_EXTERN_DECODE(D, T) extern template MMSERVE_DECODE_INSTANCE(D, T)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_EXTERN_DECODE, float)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_EXTERN_DECODE, c10::BFloat16)
MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_EXTERN_DECODE, c10::Half)

template <typename T>
std::vector<WorkItem> plan(const Args<T>& a, int64_t num_seqs) {
  std::vector<WorkItem> items;
  const int group = static_cast<int>(a.num_heads / a.num_kv_heads);
  const int tile = std::max(1, TILE_ROWS / group);
  for (int32_t b = 0; b < num_seqs; ++b) {
    const int q_len = a.query_start_loc[b + 1] - a.query_start_loc[b];
    const int first = a.seq_lens[b] - q_len;
    for (int32_t q0 = 0; q0 < q_len; q0 += tile) {
      const int32_t q1 = std::min(q_len, q0 + tile);
      const int64_t cost = static_cast<int64_t>(q_len == 1 ? group : TILE_ROWS) * (first + q1);
      for (int32_t h = 0; h < a.num_kv_heads; ++h) items.push_back({b, h, q0, q1, cost + 64});
    }
  }
  return items;
}

// Longest-processing-time binning: one bin of items per thread, similar total cost.
inline std::vector<std::vector<WorkItem>> bin_items(std::vector<WorkItem> items, int bins) {
  std::sort(items.begin(), items.end(),
            [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  std::vector<std::vector<WorkItem>> out(bins);
  std::vector<int64_t> load(bins, 0);
  for (const auto& it : items) {
    const int b = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[b].push_back(it);
    load[b] += it.cost;
  }
  // Within a bin, the tiles of one sequence's kv head run one after another: they read the
  // same keys and values, which then come from the core's cache, not memory.
  for (auto& bin : out) {
    std::sort(bin.begin(), bin.end(), [](const WorkItem& x, const WorkItem& y) {
      return std::tie(x.seq, x.kv_head, x.q_begin) < std::tie(y.seq, y.kv_head, y.q_begin);
    });
  }
  return out;
}

template <int D, typename T>
void run(const Args<T>& a, int64_t num_seqs) {
  static_assert(D % L == 0, "head_dim must be a multiple of 16");
  const int group = static_cast<int>(a.num_heads / a.num_kv_heads);
  const int bins = std::max(1, static_cast<int>(torch::stable::get_num_threads()));
  const auto work = bin_items(plan(a, num_seqs), bins);
  torch::stable::parallel_for(0, bins, 1, [&](int64_t begin, int64_t end) {
    Scratch<D> scratch;
    std::optional<PrefillScratch<D>> prefill;  // built for a bin's first prefill tile
    for (int64_t b = begin; b < end; ++b) {
      for (const auto& item : work[b]) {
        const bool decode = a.query_start_loc[item.seq + 1] - a.query_start_loc[item.seq] == 1;
        if (decode && group <= TILE_ROWS) {
          attend_decode<D, T>(a, item, group, scratch);
        } else {
          attend_tile<D, T>(a, item, group, prefill ? *prefill : prefill.emplace());
        }
      }
    }
  });
}

// The kernel for one element type; paged_attention.cpp has checked the arguments, and head_dim
// is one of MMSERVE_FOR_EACH_HEAD_DIM's (returns false for another).
template <typename T>
bool launch(const Args<T>& a, int64_t num_seqs, int64_t head_dim) {
  switch (head_dim) {
#define MMSERVE_RUN_CASE(D, T) \
  case D:                      \
    run<D, T>(a, num_seqs);    \
    return true;
    MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_RUN_CASE, T)
#undef MMSERVE_RUN_CASE
    default:
      return false;
  }
}

extern template bool launch<float>(const Args<float>&, int64_t, int64_t);
extern template bool launch<c10::BFloat16>(const Args<c10::BFloat16>&, int64_t, int64_t);
extern template bool launch<c10::Half>(const Args<c10::Half>&, int64_t, int64_t);

}  // namespace mmserve_attention
