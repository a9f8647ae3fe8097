// Causal attention over a paged KV cache for CPU, float32, bfloat16 or float16 (q, the caches and
// the output share one dtype; scores, softmax and accumulators are float32): every prefill chunk and decode of a
// step in one call, reading K/V in place through each sequence's block table (no gathered copy).
//
// Layout (as mmserve's PagedKVCache): k_cache/v_cache [num_slots, num_kv_heads, head_dim], slot =
// block_table[pos / block_size] * block_size + pos % block_size. Sequence b owns query rows
// [query_start_loc[b], query_start_loc[b + 1]) of q [T, num_heads, head_dim]; they are its last
// positions, so row i of a sequence with L = seq_lens[b] keys and n queries sits at position
// L - n + i and attends keys 0..L - n + i. The step's own K/V must already be in the cache.
//
// Work is split into items (sequence, kv head, and for prefills a tile of positions: up to 32
// query rows, all query heads of the kv head's group together), binned across threads by
// estimated cost. Each item runs an online softmax over 16-key chunks (flash-attention style)
// with float32 accumulators; prefill tiles vectorize scores and softmax across query rows,
// decodes take one dot product per key.
#include "ops.h"
#include "paged_attention_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace {

using namespace mmserve_attention;

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
std::vector<std::vector<WorkItem>> bin_items(std::vector<WorkItem> items, int bins) {
  std::sort(items.begin(), items.end(),
            [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  std::vector<std::vector<WorkItem>> out(bins);
  std::vector<int64_t> load(bins, 0);
  for (const auto& it : items) {
    const int b = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[b].push_back(it);
    load[b] += it.cost;
  }
  return out;
}

template <int D, typename T>
void run(const Args<T>& a, int64_t num_seqs) {
  static_assert(D % L == 0, "head_dim must be a multiple of 16");
  const int group = static_cast<int>(a.num_heads / a.num_kv_heads);
  const int bins = std::max(1, at::get_num_threads());
  const auto work = bin_items(plan(a, num_seqs), bins);
  at::parallel_for(0, bins, 1, [&](int64_t begin, int64_t end) {
    Scratch<D> scratch;
    for (int64_t b = begin; b < end; ++b) {
      for (const auto& item : work[b]) {
        const bool decode = a.query_start_loc[item.seq + 1] - a.query_start_loc[item.seq] == 1;
        if (decode && group <= TILE_ROWS) {
          attend_decode<D, T>(a, item, group, scratch);
        } else {
          attend_tile<D, T>(a, item, group, scratch);
        }
      }
    }
  });
}

template <typename T>
void launch(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& qsl, const at::Tensor& lens,
            at::Tensor& out, double scale, int64_t block_size) {
  const int64_t num_seqs = block_tables.size(0);
  Args<T> a{q.data_ptr<T>(),           k_cache.data_ptr<T>(),  v_cache.data_ptr<T>(),
            out.data_ptr<T>(),         block_tables.data_ptr<int32_t>(), qsl.data_ptr<int32_t>(),
            lens.data_ptr<int32_t>(),  block_tables.size(1),   block_size,
            q.size(1),                 k_cache.size(1),        static_cast<float>(scale),
            q.stride(0)};
  const int64_t num_blocks = k_cache.size(0) / block_size;
  const int32_t* table = a.block_tables;
  for (int64_t i = 0; i < num_seqs * a.max_blocks; ++i) {
    TORCH_CHECK(table[i] >= 0 && table[i] < num_blocks, "block id ", table[i], " out of range");
  }
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t n = a.query_start_loc[b + 1] - a.query_start_loc[b];
    TORCH_CHECK(n >= 0 && a.seq_lens[b] >= n, "sequence ", b, ": seq_len below its query count");
    TORCH_CHECK((a.seq_lens[b] + block_size - 1) / block_size <= a.max_blocks,
                "sequence ", b, ": block table too short for seq_len");
  }
  switch (q.size(2)) {
    case 32: run<32, T>(a, num_seqs); break;
    case 64: run<64, T>(a, num_seqs); break;
    case 80: run<80, T>(a, num_seqs); break;
    case 96: run<96, T>(a, num_seqs); break;
    case 128: run<128, T>(a, num_seqs); break;
    case 256: run<256, T>(a, num_seqs); break;
    default: TORCH_CHECK(false, "unsupported head_dim ", q.size(2), " (32, 64, 80, 96, 128, 256)");
  }
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                           double scale, int64_t block_size) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 3 &&
                  (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf),
              "q must be a float32, bfloat16 or float16 CPU tensor [tokens, heads, head_dim]");
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype &&
                  k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes(),
              "k_cache/v_cache must be [slots, kv_heads, head_dim] of q's dtype");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "q rows must hold contiguous heads; k_cache and v_cache must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 &&
                  block_tables.is_contiguous(),
              "block_tables must be contiguous int32 [seqs, max_blocks]");
  const int64_t num_seqs = block_tables.size(0);
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && query_start_loc.numel() == num_seqs + 1,
              "query_start_loc must be int32 [seqs + 1]");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.numel() == num_seqs,
              "seq_lens must be int32 [seqs]");
  const int64_t num_heads = q.size(1), num_kv_heads = k_cache.size(1), head_dim = q.size(2);
  TORCH_CHECK(k_cache.size(2) == head_dim && num_heads % num_kv_heads == 0,
              "head_dim must match and num_heads be a multiple of num_kv_heads");
  TORCH_CHECK(num_heads / num_kv_heads <= TILE_ROWS, "more than ", TILE_ROWS,
              " query heads per kv head");
  TORCH_CHECK(block_size > 0, "block_size must be positive");
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  const auto qsl = query_start_loc.contiguous();
  const auto lens = seq_lens.contiguous();
  TORCH_CHECK(qsl[num_seqs].item<int32_t>() == q.size(0), "query_start_loc[-1] != tokens");
  if (dtype == at::kFloat) {
    launch<float>(q, k_cache, v_cache, block_tables, qsl, lens, out, scale, block_size);
  } else if (dtype == at::kBFloat16) {
    launch<c10::BFloat16>(q, k_cache, v_cache, block_tables, qsl, lens, out, scale, block_size);
  } else {
    launch<c10::Half>(q, k_cache, v_cache, block_tables, qsl, lens, out, scale, block_size);
  }
  return out;
}
