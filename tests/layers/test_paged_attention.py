"""The compiled CPU paged-attention kernel and the pure-torch fallback against a naive
reference (gather every key, one masked softmax per query), over mixed batches."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from mmserve.kernels import load_variant, paged_attention_kernel, unavailable_reason
from mmserve.kernels.variants import runnable_variants
from mmserve.layers.attention import (
    AttentionMetadata,
    PagedKVCache,
    paged_attention,
    select_attention_backend,
)

CPU = torch.device("cpu")


def build_batch(seqs: list[tuple[int, int]], block_size: int, num_blocks: int, seed: int):
    """seqs: (keys after this step, queries this step); blocks drawn at random (fragmented)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=gen)
    tables, used = [], 0
    for total, _ in seqs:
        n = -(-total // block_size)
        tables.append(perm[used : used + n])
        used += n
    q_lens = torch.tensor([n for _, n in seqs])
    lens = torch.tensor([total for total, _ in seqs])
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.long)
    torch.cumsum(q_lens, 0, out=qsl[1:])
    row = torch.repeat_interleave(torch.arange(len(seqs)), q_lens)
    pos = torch.arange(int(qsl[-1])) - qsl[row] + (lens - q_lens)[row]
    table = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True)
    slots = table[row, pos // block_size] * block_size + pos % block_size
    return table, qsl, lens, slots


def naive_attention(q, k_cache, v_cache, table, qsl, lens, block_size, scale):
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for b in range(len(lens)):
        total, start, end = int(lens[b]), int(qsl[b]), int(qsl[b + 1])
        pos = torch.arange(total)
        slots = table[b, pos // block_size] * block_size + pos % block_size
        k = k_cache[slots].repeat_interleave(group, dim=1).transpose(0, 1)  # [H, total, D]
        v = v_cache[slots].repeat_interleave(group, dim=1).transpose(0, 1)
        qs = q[start:end].transpose(0, 1).double()
        scores = qs @ k.double().transpose(1, 2) * scale
        q_pos = torch.arange(end - start)[:, None] + total - (end - start)
        scores = scores.masked_fill(pos[None, :] > q_pos, float("-inf"))
        out[start:end] = (scores.softmax(-1) @ v.double()).transpose(0, 1).float()
    return out


BATCHES = {
    "decodes": [(330, 1)] * 9,
    "fresh prefills": [(40, 40), (17, 17), (1, 1)],
    "continued chunks": [(70, 33), (16, 16), (95, 2)],
    "mixed step": [(129, 1), (50, 50), (200, 64), (3, 1), (33, 17)],
    # decodes over many chunks of keys, at and around powers of two
    "long decodes": [(1000, 1), (256, 1), (128, 1), (129, 1), (1, 1)],
}


@pytest.mark.parametrize("backend", ["cpu-kernel", "torch"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(8, 4, 64, 16), (4, 4, 32, 16), (7, 1, 128, 32), (6, 2, 80, 5)],
)
def test_matches_naive_reference(backend, batch, heads, kv_heads, head_dim, block_size):
    seqs = BATCHES[batch]
    num_blocks = sum(-(-total // block_size) for total, _ in seqs) + 7
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, torch.float32, CPU)
    table, qsl, lens, slots = build_batch(seqs, block_size, num_blocks, seed=heads)
    gen = torch.Generator().manual_seed(1)
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    tokens = int(qsl[-1])
    q = torch.randn(tokens, heads, head_dim, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl.int(),
        seq_lens=lens.int(),
        block_tables=table.int(),
        block_size=block_size,
        query_lens_host=[n for _, n in seqs],
        seq_lens_host=[total for total, _ in seqs],
        use_kernel=backend == "cpu-kernel",
    )
    scale = head_dim**-0.5
    out = paged_attention(0, cache, q, k, v, meta, scale)
    assert torch.equal(cache.keys[0][slots], k) and torch.equal(cache.values[0][slots], v)
    keys, values = cache.keys[0], cache.values[0]
    expected = naive_attention(q, keys, values, table, qsl, lens, block_size, scale)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


def test_kernel_was_built():
    """CI installs with the kernels; the engine's default backend on CPU is the kernel."""
    assert paged_attention_kernel() is not None, unavailable_reason()
    assert select_attention_backend("auto", CPU, torch.float32, 64) == "cpu-kernel"


def test_backend_selection_falls_back_or_names_the_reason():
    assert select_attention_backend("auto", CPU, torch.float64, 64) == "torch"
    assert select_attention_backend("auto", CPU, torch.float32, 48) == "torch"
    assert select_attention_backend("torch", CPU, torch.float32, 64) == "torch"
    with pytest.raises(ValueError, match="has no float64"):
        select_attention_backend("cpu-kernel", CPU, torch.float64, 64)
    with pytest.raises(ValueError, match="head_dim 48"):
        select_attention_backend("cpu-kernel", CPU, torch.float32, 48)
    with pytest.raises(ValueError, match="'flash'"):
        select_attention_backend("flash", CPU, torch.float32, 64)


def test_kernel_rejects_out_of_range_blocks_and_other_head_dims():
    kernel = paged_attention_kernel()
    assert kernel is not None, unavailable_reason()
    k_cache = torch.zeros(4 * 16, 2, 64)
    q = torch.zeros(1, 2, 64)
    table = torch.tensor([[9]], dtype=torch.int32)
    qsl, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block id 9 out of range"):
        kernel(q, k_cache, k_cache, table, qsl, lens, 0.125, 16)
    with pytest.raises(RuntimeError, match="block table too short"):
        kernel(q, k_cache, k_cache, table[:, :0].contiguous(), qsl, lens, 0.125, 16)
    ok_table = torch.tensor([[1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="unsupported head_dim 48"):
        kernel(
            q[..., :48].contiguous(),
            k_cache[..., :48].contiguous(),
            k_cache[..., :48].contiguous(),
            ok_table,
            qsl,
            lens,
            0.125,
            16,
        )


def random_step(seqs: list[tuple[int, int]], heads: int, kv_heads: int, seed: int):
    """Random q and a random head_dim-64 cache (block size 16) for ``build_batch(seqs)``."""
    block_size = 16
    num_blocks = sum(-(-total // block_size) for total, _ in seqs) + 3
    table, qsl, lens, _ = build_batch(seqs, block_size, num_blocks, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    k_cache = torch.randn(num_blocks * block_size, kv_heads, 64, generator=gen)
    v_cache = torch.randn(num_blocks * block_size, kv_heads, 64, generator=gen)
    q = torch.randn(int(qsl[-1]), heads, 64, generator=gen)
    return q, k_cache, v_cache, table, qsl, lens


@pytest.mark.parametrize("variant", ["avx512", "avx2", "generic"])
def test_every_built_variant_matches_the_reference(variant):
    """Each instruction-set build this CPU can run (the loader only picks the widest; an
    install builds that one unless MMSERVE_KERNEL_VARIANTS asks for more, as CI does)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if variant not in runnable_variants(capability):
        pytest.skip(f"this CPU ({capability}) cannot run the {variant} build")
    if importlib.util.find_spec(f"mmserve.kernels._C_{variant}") is None:
        pytest.skip(f"the {variant} build was not asked for (MMSERVE_KERNEL_VARIANTS)")
    ops = load_variant(variant)
    block_size = 16
    q, k_cache, v_cache, table, qsl, lens = random_step(BATCHES["mixed step"], 8, 2, seed=3)
    out = ops.paged_attention(
        q, k_cache, v_cache, table.int(), qsl.int(), lens.int(), 0.125, block_size
    )
    expected = naive_attention(q, k_cache, v_cache, table, qsl, lens, block_size, 0.125)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


def test_a_decode_has_the_same_bits_alone_beside_others_and_on_one_thread():
    """The kernel's result for a sequence depends on that sequence only: not on the step's other
    sequences nor on the thread count. A split of a decode's keys that depended on the step
    (flash-decoding sized to the threads) would break this."""
    kernel = paged_attention_kernel()
    assert kernel is not None, unavailable_reason()
    block_size = 16
    seqs = [(300, 1), (700, 1), (50, 20), (90, 1)]
    q, k_cache, v_cache, table, qsl, lens = random_step(seqs, 9, 3, seed=5)
    args = (table.int(), qsl.int(), lens.int(), 0.125, block_size)
    beside = kernel(q, k_cache, v_cache, *args)
    one_row = torch.tensor([0, 1], dtype=torch.int32)
    alone = kernel(
        q[1:2], k_cache, v_cache, table[1:2].int(), one_row, lens[1:2].int(), 0.125, block_size
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_thread = kernel(q, k_cache, v_cache, *args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone[0], beside[1])
    assert torch.equal(one_thread, beside)


def test_auto_fallback_on_cpu_float32_is_logged(caplog):
    with caplog.at_level("WARNING", logger="mmserve.layers.attention"):
        assert select_attention_backend("auto", CPU, torch.float32, 48) == "torch"
    assert "head_dim 48" in caplog.text


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_cpu_kv_cache_is_zero_without_touching_its_memory() -> None:
    """The CPU cache's zeros cost no memset and no resident memory until written; a write
    lands where a view of the same slot reads it, and the rest stays zero."""
    before = _rss_bytes()
    cache = PagedKVCache(4, 512, 16, 8, 128, torch.bfloat16, torch.device("cpu"))
    size = 2 * 4 * 512 * 16 * 8 * 128 * 2  # 128 MiB
    assert _rss_bytes() - before < size // 8
    assert cache.keys[0].shape == (512 * 16, 8, 128) and cache.keys[3].dtype == torch.bfloat16
    cache.values[2][5] = 1.5
    assert cache.values[2][5].eq(1.5).all() and cache.values[2][:5].eq(0).all()
    assert all(t.count_nonzero() == 0 for t in cache.keys + cache.values[:2] + cache.values[3:])
