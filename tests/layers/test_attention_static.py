"""The fixed-shape decode attention (CUDA graphs' path) against the naive reference and the
eager torch path: padded rows and key positions past a row's length change nothing."""

from __future__ import annotations

import pytest
import torch

from mmserve.layers.attention import AttentionMetadata, PagedKVCache, paged_attention
from mmserve.layers.attention_static import StaticDecodePlan
from tests.layers.test_paged_attention import build_batch, naive_attention

CPU = torch.device("cpu")
LENGTHS = [1, 17, 200, 16, 33]  # keys after this step, one query each


def static_meta(table, lens, slots, rows: int, context: int, block_size: int, pad_block: int):
    """The batch padded to ``rows`` rows and ``context`` key positions, as the worker pads it:
    padding rows have one key, in the pad block, and every table column past a row's blocks
    names the pad block."""
    width = context // block_size
    tables = torch.full((rows, width), pad_block, dtype=torch.long)
    tables[: len(lens), : table.shape[1]] = table
    for b, total in enumerate(lens.tolist()):  # pad_sequence filled the short rows with 0
        tables[b, -(-total // block_size) :] = pad_block
    seq_lens = torch.ones(rows, dtype=torch.long)
    seq_lens[: len(lens)] = lens
    slot_mapping = torch.full((rows,), pad_block * block_size, dtype=torch.long)
    slot_mapping[: len(lens)] = slots
    return AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
        seq_lens=seq_lens,
        block_tables=tables,
        block_size=block_size,
        query_lens_host=[1] * rows,
        seq_lens_host=seq_lens.tolist(),
        use_kernel=False,
        static_decode=StaticDecodePlan.build(tables, seq_lens, block_size),
    )


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(8, 4, 64, 16), (4, 4, 32, 16), (7, 1, 128, 32), (6, 2, 80, 5)],
)
def test_padded_decode_rows_match_the_reference_and_the_eager_path(
    heads: int, kv_heads: int, head_dim: int, block_size: int
) -> None:
    seqs = [(total, 1) for total in LENGTHS]
    num_blocks = sum(-(-total // block_size) for total in LENGTHS) + 3
    pad_block = num_blocks  # one block past the scheduler's
    cache = PagedKVCache(1, num_blocks + 1, block_size, kv_heads, head_dim, torch.float32, CPU)
    table, qsl, lens, slots = build_batch(seqs, block_size, num_blocks, seed=heads)
    gen = torch.Generator().manual_seed(2)
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    rows, context = 8, -(-256 // block_size) * block_size
    q = torch.randn(rows, heads, head_dim, generator=gen)
    k = torch.randn(rows, kv_heads, head_dim, generator=gen)
    v = torch.randn(rows, kv_heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    real = len(LENGTHS)
    before = cache.keys[0].clone()
    meta = static_meta(table, lens, slots, rows, context, block_size, pad_block)
    out = paged_attention(0, cache, q, k, v, meta, scale)
    # the padding rows wrote the pad block only; the real rows their own slots
    changed = (cache.keys[0] != before).any(-1).any(-1).nonzero().flatten()
    pad_slots = set(range(pad_block * block_size, (pad_block + 1) * block_size))
    assert set(changed.tolist()) <= set(slots.tolist()) | pad_slots
    assert set(slots.tolist()) <= set(changed.tolist())
    keys, values = cache.keys[0], cache.values[0]
    expected = naive_attention(q[:real], keys, values, table, qsl, lens, block_size, scale)
    torch.testing.assert_close(out[:real], expected, rtol=1e-5, atol=2e-6)
    # the eager torch path over the same (now written) cache
    eager_meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl.int(),
        seq_lens=lens.int(),
        block_tables=table.int(),
        block_size=block_size,
        query_lens_host=[1] * real,
        seq_lens_host=lens.tolist(),
        use_kernel=False,
    )
    eager = paged_attention(0, cache, q[:real], k[:real], v[:real], eager_meta, scale)
    torch.testing.assert_close(out[:real], eager, rtol=1e-5, atol=2e-6)
    # whatever the padding rows and the pad block hold, the real rows do not change
    cache.keys[0][pad_block * block_size :] = 1e4
    q[real:] = -3.0
    again = paged_attention(0, cache, q, k, v, meta, scale)
    assert torch.equal(again[:real], out[:real])


def test_the_plan_has_the_bucket_shape_whatever_the_lengths() -> None:
    tables = torch.tensor([[3, 0, 0, 0], [1, 2, 0, 0]])
    short = StaticDecodePlan.build(tables, torch.tensor([1, 20]), 16)
    long = StaticDecodePlan.build(tables, torch.tensor([64, 33]), 16)
    assert short.key_slots.shape == long.key_slots.shape == (2 * 64,)
    assert short.visible.shape == long.visible.shape == (2, 1, 1, 64)
    assert short.visible[0].sum() == 1 and short.visible[1].sum() == 20
    assert short.key_slots[:3].tolist() == [48, 49, 50]  # block 3, positions 0..2
    assert short.key_slots[64 + 16].item() == 2 * 16  # row 1, position 16: block 2
