"""The torch attention path with explicit masks (Gemma 3: sliding windows, bidirectional
attention within an image) against a naive per-query reference, and the backend choice for
models that need such masks."""

from __future__ import annotations

import math

import pytest
import torch

from mmserve.layers.attention import (
    AttentionMetadata,
    PagedKVCache,
    paged_attention,
    select_attention_backend,
)
from mmserve.layers.attention_masks import window_start
from tests.layers.test_paged_attention import build_batch

CPU = torch.device("cpu")


def allowed(p: int, j: int, images: list[tuple[int, int]], window: int | None) -> bool:
    same = any(a <= p < b and a <= j < b for a, b in images)
    return (j <= p or same) and (window is None or j > p - window)


def naive(q, k_cache, v_cache, table, qsl, lens, bs, scale, images, window):
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for b in range(len(lens)):
        total, start, end = int(lens[b]), int(qsl[b]), int(qsl[b + 1])
        for row in range(start, end):
            p = total - (end - start) + (row - start)
            keys = [j for j in range(total) if allowed(p, j, images[b], window)]
            slots = torch.tensor([int(table[b, j // bs]) * bs + j % bs for j in keys])
            k = k_cache[slots].repeat_interleave(group, dim=1).double()  # [n, H, D]
            v = v_cache[slots].repeat_interleave(group, dim=1).double()
            scores = torch.einsum("hd,nhd->hn", q[row].double(), k) * scale
            out[row] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).float()
    return out


# (keys after the step, queries this step, image ranges overlapping the queries)
SEQS = [
    (30, 30, [(5, 21)]),  # fresh prefill holding a whole image
    (50, 26, [(26, 42)]),  # a later chunk that starts right at an image
    (40, 12, [(20, 36)]),  # a prefix hit ended inside the image: the rest of it + text
    (61, 1, []),  # decodes
    (9, 1, []),
    (20, 20, [(2, 6), (6, 14)]),  # two adjacent images: two groups, not one
]


def masked_batch(seed: int = 3):
    """(cache, q, k, v, meta, block table) of ``SEQS`` with random keys, values, queries."""
    heads, kv_heads, dim, bs = 4, 2, 16, 4
    seqs = [(total, n) for total, n, _ in SEQS]
    num_blocks = sum(-(-total // bs) for total, _ in seqs) + 3
    cache = PagedKVCache(1, num_blocks, bs, kv_heads, dim, torch.float32, CPU)
    table, qsl, lens, slots = build_batch(seqs, bs, num_blocks, seed=seed)
    gen = torch.Generator().manual_seed(0)
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    q = torch.randn(int(qsl[-1]), heads, dim, generator=gen)
    k, v = cache.keys[0][slots].clone(), cache.values[0][slots].clone()
    meta = AttentionMetadata(
        slots,
        qsl.to(torch.int32),
        lens.to(torch.int32),
        table.to(torch.int32),
        bs,
        [n for _, n in seqs],
        [total for total, _ in seqs],
        use_kernel=False,
        image_ranges=[ranges for _, _, ranges in SEQS],
    )
    return cache, q, k, v, meta, table


def reference(q, cache, meta, table, window):
    qsl, lens = meta.query_start_loc, meta.seq_lens
    scale = 1 / math.sqrt(q.shape[-1])
    args = (table, qsl, lens, meta.block_size, scale, meta.image_ranges, window)
    return naive(q, cache.keys[0], cache.values[0], *args)


@pytest.mark.parametrize("window", [None, 4, 8])
def test_masked_torch_path_matches_naive_reference(window):
    cache, q, k, v, meta, table = masked_batch()
    got = paged_attention(0, cache, q, k, v, meta, 1 / math.sqrt(q.shape[-1]), window)
    want = reference(q, cache, meta, table, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [4, 8])
def test_local_layers_read_only_their_window(window):
    """A layer with a window gathers only the keys its queries can see: the cached keys and
    values before each sequence's window are NaN and the output is still the reference's;
    decode rows gather ``window`` keys, a prefill chunk the window before it and its own."""
    cache, q, k, v, meta, table = masked_batch()
    want = reference(q, cache, meta, table, window)
    bs = meta.block_size
    for row, (total, n) in enumerate(zip(meta.seq_lens_host, meta.query_lens_host, strict=True)):
        unseen = torch.arange(window_start(total - n, window))
        slots = table[row, unseen // bs] * bs + unseen % bs
        cache.keys[0][slots] = float("nan")
        cache.values[0][slots] = float("nan")
    got = paged_attention(0, cache, q, k, v, meta, 1 / math.sqrt(q.shape[-1]), window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    view = meta.torch_plan().view(window)
    assert view.decode_slots.shape[1] == window  # every decode context is longer
    for seg, slots in zip(meta.torch_plan().prefills, view.prefill_slots, strict=True):
        if slots is not None:
            assert slots.numel() == seg.key_slots.numel() - window_start(seg.first_pos, window)
            assert slots.numel() <= window - 1 + seg.q_len < seg.key_slots.numel()


def test_models_with_masks_never_get_the_causal_kernel():
    needs = "a sliding window"
    assert select_attention_backend("auto", CPU, torch.float32, 64, needs) == "torch"
    with pytest.raises(ValueError, match="causal only; the model needs a sliding window"):
        select_attention_backend("cpu-kernel", CPU, torch.float32, 64, needs)
    with pytest.raises(ValueError, match="'flex' is not available: its block mask is causal"):
        select_attention_backend("flex", CPU, torch.float32, 64, needs)
