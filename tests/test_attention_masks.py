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
from tests.test_paged_attention import build_batch

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


@pytest.mark.parametrize("window", [None, 4, 8])
def test_masked_torch_path_matches_naive_reference(window):
    heads, kv_heads, dim, bs = 4, 2, 16, 4
    seqs = [(total, n) for total, n, _ in SEQS]
    images = [ranges for _, _, ranges in SEQS]
    num_blocks = sum(-(-total // bs) for total, _ in seqs) + 3
    cache = PagedKVCache(1, num_blocks, bs, kv_heads, dim, torch.float32, CPU)
    table, qsl, lens, slots = build_batch(seqs, bs, num_blocks, seed=3)
    gen = torch.Generator().manual_seed(0)
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    t = int(qsl[-1])
    q = torch.randn(t, heads, dim, generator=gen)
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
        image_ranges=images,
    )
    scale = 1 / math.sqrt(dim)
    got = paged_attention(0, cache, q, k, v, meta, scale, window)
    want = naive(q, cache.keys[0], cache.values[0], table, qsl, lens, bs, scale, images, window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_models_with_masks_never_get_the_causal_kernel():
    needs = "a sliding window"
    assert select_attention_backend("auto", CPU, torch.float32, 64, needs) == "torch"
    with pytest.raises(ValueError, match="causal only; the model needs a sliding window"):
        select_attention_backend("cpu-kernel", CPU, torch.float32, 64, needs)
    with pytest.raises(ValueError, match="'flex' is not available: its block mask is causal"):
        select_attention_backend("flex", CPU, torch.float32, 64, needs)
