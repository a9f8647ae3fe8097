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
// Work is split into items (sequence, kv head, and for prefills a tile of positions: up to 64
// query rows, all query heads of the kv head's group together), binned across threads by
// estimated cost, each bin's items of one sequence's kv head in a row. Each item runs an online
// softmax over chunks of keys (flash-attention style) with float32 accumulators: prefill tiles
// in GEMM-like register blocks with query rows as lanes (paged_attention_prefill.h), decodes
// one dot product per key (paged_attention_decode.cpp).
#include "ops.h"
#include "paged_attention_launch.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

using mmserve_attention::Args;
using mmserve_attention::launch;
using mmserve_attention::TILE_ROWS;
using torch::headeronly::ScalarType;

namespace {

#define MMSERVE_HEAD_DIM_ITEM(D, T) D,
constexpr int64_t HEAD_DIMS[] = {MMSERVE_FOR_EACH_HEAD_DIM(MMSERVE_HEAD_DIM_ITEM, _)};
#undef MMSERVE_HEAD_DIM_ITEM

std::string head_dims_text() {
  std::ostringstream text;
  for (const int64_t d : HEAD_DIMS) text << (d == HEAD_DIMS[0] ? "" : ", ") << d;
  return text.str();
}

}  // namespace

std::vector<int64_t> supported_head_dims() {
  return {std::begin(HEAD_DIMS), std::end(HEAD_DIMS)};
}

Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& block_tables, const Tensor& query_start_loc,
                       const Tensor& seq_lens, double scale, int64_t block_size) {
  const auto dtype = q.scalar_type();
  MMSERVE_CHECK(q.is_cpu() && q.dim() == 3 &&
                    (dtype == ScalarType::Float || dtype == ScalarType::BFloat16 ||
                     dtype == ScalarType::Half),
                "q must be a float32, bfloat16 or float16 CPU tensor [tokens, heads, head_dim]");
  MMSERVE_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype &&
                    k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes(),
                "k_cache/v_cache must be [slots, kv_heads, head_dim] of q's dtype");
  MMSERVE_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && k_cache.is_contiguous() &&
                    v_cache.is_contiguous(),
                "q rows must hold contiguous heads; k_cache and v_cache must be contiguous");
  MMSERVE_CHECK(block_tables.scalar_type() == ScalarType::Int && block_tables.dim() == 2 &&
                    block_tables.is_contiguous(),
                "block_tables must be contiguous int32 [seqs, max_blocks]");
  const int64_t num_seqs = block_tables.size(0);
  MMSERVE_CHECK(query_start_loc.scalar_type() == ScalarType::Int &&
                    query_start_loc.numel() == num_seqs + 1,
                "query_start_loc must be int32 [seqs + 1]");
  MMSERVE_CHECK(seq_lens.scalar_type() == ScalarType::Int && seq_lens.numel() == num_seqs,
                "seq_lens must be int32 [seqs]");
  const int64_t num_heads = q.size(1), num_kv_heads = k_cache.size(1), head_dim = q.size(2);
  MMSERVE_CHECK(k_cache.size(2) == head_dim && num_heads % num_kv_heads == 0,
                "head_dim must match and num_heads be a multiple of num_kv_heads");
  MMSERVE_CHECK(num_heads / num_kv_heads <= TILE_ROWS, "more than ", TILE_ROWS,
                " query heads per kv head");
  MMSERVE_CHECK(block_size > 0, "block_size must be positive");
  const Tensor qsl = mmserve::contiguous(query_start_loc);
  const Tensor lens = mmserve::contiguous(seq_lens);
  const int32_t* starts = qsl.const_data_ptr<int32_t>();
  const int32_t* lengths = lens.const_data_ptr<int32_t>();
  MMSERVE_CHECK(starts[num_seqs] == q.size(0), "query_start_loc[-1] != tokens");
  const int64_t max_blocks = block_tables.size(1);
  const int64_t num_blocks = k_cache.size(0) / block_size;
  const int32_t* table = block_tables.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < num_seqs * max_blocks; ++i) {
    MMSERVE_CHECK(table[i] >= 0 && table[i] < num_blocks, "block id ", table[i], " out of range");
  }
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t n = starts[b + 1] - starts[b];
    MMSERVE_CHECK(n >= 0 && lengths[b] >= n, "sequence ", b, ": seq_len below its query count");
    MMSERVE_CHECK((lengths[b] + block_size - 1) / block_size <= max_blocks, "sequence ", b,
                  ": block table too short for seq_len");
  }
  const Tensor out = mmserve::new_empty(q, {q.size(0), q.size(1), q.size(2)});
  const auto run = [&](auto zero) {
    using T = decltype(zero);
    const Args<T> args{q.const_data_ptr<T>(),   k_cache.const_data_ptr<T>(),
                       v_cache.const_data_ptr<T>(), out.mutable_data_ptr<T>(),
                       table,                   starts,
                       lengths,                 max_blocks,
                       block_size,              num_heads,
                       num_kv_heads,            static_cast<float>(scale),
                       q.stride(0)};
    return launch<T>(args, num_seqs, head_dim);
  };
  const bool supported = dtype == ScalarType::Float      ? run(float{})
                         : dtype == ScalarType::BFloat16 ? run(c10::BFloat16{})
                                                         : run(c10::Half{});
  MMSERVE_CHECK(supported, "unsupported head_dim ", head_dim, " (", head_dims_text(), ")");
  return out;
}
