"""Which attention path a step takes with the CPU kernel selected: the kernel for every row
that follows keys of earlier steps (decodes, a chunk after a cached prefix or an earlier
chunk), the torch path's causal SDPA for chunks that start a prompt (``AttentionMetadata``
says why)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mmserve.layers.attention as attention
from mmserve import LLM, SamplingParams


def test_prefill_chunks_take_the_torch_path_and_decode_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = LLM("tiny-llava", dtype="float32", attention_backend="cpu-kernel", seed=0)
    kernel = attention.paged_attention_kernel()
    assert kernel is not None
    rows: list[int] = []

    def counting() -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, *args: Any) -> torch.Tensor:
            rows.append(q.shape[0])
            return kernel(q, *args)

        return run

    monkeypatch.setattr(attention, "paged_attention_kernel", counting)
    prompts = ["A long story about ships " * 6, "Tell me about the sea"]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = llm.generate(prompts, params, use_tqdm=False)
    layers = llm.engine.config.model.hf_config.text_config.num_hidden_layers
    # 3 decode steps of 2 sequences, one query row each, through every layer; no prefill rows
    assert rows == [2] * (3 * layers)
    # the same tokens as the kernel-free torch backend
    torch_llm = LLM("tiny-llava", dtype="float32", attention_backend="torch", seed=0)
    same = torch_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in same]


def test_a_steps_continued_rows_take_the_kernel_while_its_starting_chunk_takes_sdpa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that starts one prompt while other sequences decode or continue a chunked
    prompt: the starting chunk's rows go to SDPA over its own keys, every row after earlier
    keys (one or many per sequence) to the kernel, and the tokens are the torch backend's."""
    llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="cpu-kernel", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    kernel = attention.paged_attention_kernel()
    sdpa = attention.torch_paged_attention
    assert kernel is not None
    calls: list[tuple[str, list[int]]] = []

    def kernel_rows() -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, *args: Any) -> torch.Tensor:
            query_lens, seq_lens = args[3].diff().tolist(), args[4].tolist()
            assert (
                all(k > n for n, k in zip(query_lens, seq_lens, strict=True))
                or max(query_lens) == 1
            ), "a starting chunk reached the kernel in a mixed step"
            calls.append(("kernel", query_lens))
            return kernel(q, *args)

        return run

    def sdpa_rows(*args: Any, **kwargs: Any) -> torch.Tensor:
        plan = args[5]
        decodes = [1] * plan.decode_token_idx.numel()  # any decode row here is a failure
        calls.append(("sdpa", [seg.first_pos for seg in plan.prefills] + decodes))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention, "paged_attention_kernel", kernel_rows)
    monkeypatch.setattr(attention, "torch_paged_attention", sdpa_rows)
    # the short prompt decodes while the long ones are prefilled 16 tokens a step, the second
    # starting while the first is still being continued
    long = "A long story about ships and the sea and the wind " * 3
    prompts = ["Hi", long, "Another tale of " + long]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompts, params, use_tqdm=False)
    layers = llm.engine.config.model.hf_config.text_config.num_hidden_layers
    assert all(pos == 0 for kind, firsts in calls if kind == "sdpa" for pos in firsts)
    assert any(kind == "kernel" and max(lens) > 1 for kind, lens in calls)  # continued chunks
    mixed = sum(a[0] == "sdpa" and b[0] == "kernel" for a, b in itertools.pairwise(calls))
    assert layers >= 2 and mixed >= layers  # a mixed step, every layer
    monkeypatch.undo()
    torch_llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="torch", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    same = torch_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in same]
