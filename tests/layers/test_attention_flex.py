"""The flex_attention backend reads K/V in place through the block tables and agrees with the
gather + SDPA path on mixed steps (fresh prefills, chunks after a prefix, decodes, shared
prefix blocks), and an engine on it gives transformers' greedy tokens."""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.layers.attention import AttentionMetadata, PagedKVCache, paged_attention
from tests.support.engine import assert_no_leaks

BS, KVH, H, D = 4, 2, 4, 16


def step_meta(tables: list[list[int]], q_lens: list[int], seq_lens: list[int], flex: bool):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    rows = torch.repeat_interleave(torch.arange(len(q_lens)), torch.tensor(q_lens))
    pos = torch.arange(sum(q_lens)) - qsl[:-1].long()[rows]
    pos += (torch.tensor(seq_lens) - torch.tensor(q_lens))[rows]
    slots = padded.long()[rows, pos // BS] * BS + pos % BS
    return AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=padded,
        block_size=BS,
        query_lens_host=q_lens,
        seq_lens_host=seq_lens,
        use_kernel=False,
        use_flex=flex,
    )


def test_flex_matches_gather_sdpa_on_a_mixed_step_with_shared_blocks() -> None:
    torch.manual_seed(0)
    num_blocks = 24
    # seq 0: fresh prefill of 7; seq 1: 5 new tokens after 6 computed; seqs 2 and 3 share
    # blocks 9 and 10 (a cached prefix) and decode one token each; seq 4: a 1-token prefill
    tables = [[3, 5], [7, 1, 2, 12], [9, 10, 4], [9, 10, 6, 8], [20]]
    q_lens, seq_lens = [7, 5, 1, 1, 1], [7, 11, 10, 13, 1]
    context = torch.randn(num_blocks * BS, KVH, D)  # what earlier steps wrote
    outs = []
    for flex in (False, True):
        cache = PagedKVCache(1, num_blocks, BS, KVH, D, torch.float32, torch.device("cpu"))
        cache.keys[0].copy_(context)
        cache.values[0].copy_(context.flip(0))
        meta = step_meta(tables, q_lens, seq_lens, flex)
        gen = torch.Generator().manual_seed(1)
        q = torch.randn(sum(q_lens), H, D, generator=gen)
        k = torch.randn(sum(q_lens), KVH, D, generator=gen)
        v = torch.randn(sum(q_lens), KVH, D, generator=gen)
        outs.append(paged_attention(0, cache, q, k, v, meta, D**-0.5))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_an_engine_on_flex_gives_transformers_greedy_tokens(
    reference, images, prefix_caching: bool
) -> None:
    llm = LLM(
        "tiny-llava",
        attention_backend="flex",
        num_kv_blocks=96,
        max_model_len=512,
        max_num_batched_tokens=96,
        enable_prefix_caching=prefix_caching,
    )
    prompt = "USER: <image>\nDescribe the picture. ASSISTANT:"
    cases = [(prompt, [images[0]]), (prompt, [images[0]]), (prompt, [images[1]])]
    outs = llm.generate(
        [{"prompt": p, "images": ims} for p, ims in cases],
        SamplingParams(temperature=0, max_tokens=8),
        use_tqdm=False,
    )
    for (p, ims), out in zip(cases, outs, strict=True):
        assert out.outputs[0].token_ids == reference.greedy(p, ims, 8)
    assert_no_leaks(llm)
