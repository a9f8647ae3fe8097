"""Which attention path a step takes with the CPU kernel selected: every step in one kernel
call, its prefill chunks and decodes alike (the kernel reads the paged cache in place; the
torch path gathers each sequence's keys into a copy first), with the tokens of the torch
backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mmserve.layers.attention as attention
from mmserve import LLM, SamplingParams


def counting_kernel(calls: list[list[int]]) -> Callable[[], Callable[..., torch.Tensor]]:
    """A stand-in for ``paged_attention_kernel`` that records each call's query lengths."""
    kernel = attention.paged_attention_kernel()
    assert kernel is not None

    def get() -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, *args: Any) -> torch.Tensor:
            calls.append(args[3].diff().tolist())
            return kernel(q, *args)

        return run

    return get


def no_torch_path(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise AssertionError("a step took the torch path with the CPU kernel selected")


def test_prefills_and_decodes_take_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM("tiny-llava", dtype="float32", attention_backend="cpu-kernel", seed=0)
    calls: list[list[int]] = []
    monkeypatch.setattr(attention, "paged_attention_kernel", counting_kernel(calls))
    monkeypatch.setattr(attention, "torch_paged_attention", no_torch_path)
    prompts = ["A long story about ships " * 6, "Tell me about the sea"]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = llm.generate(prompts, params, use_tqdm=False)
    layers = llm.engine.config.model.hf_config.text_config.num_hidden_layers
    # one prefill step of both prompts, then 3 decode steps of 2 sequences, every layer
    assert len(calls) == 4 * layers
    assert all(min(lens) > 1 for lens in calls[:layers])
    assert all(lens == [1, 1] for lens in calls[layers:])
    monkeypatch.undo()
    torch_llm = LLM("tiny-llava", dtype="float32", attention_backend="torch", seed=0)
    same = torch_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in same]


def test_a_step_mixing_a_prefill_chunk_and_decodes_is_one_kernel_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that prefills a chunk of one prompt while other sequences decode: one kernel
    call per layer takes both (the chunk after its earlier keys in the cache)."""
    llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="cpu-kernel", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    calls: list[list[int]] = []
    monkeypatch.setattr(attention, "paged_attention_kernel", counting_kernel(calls))
    monkeypatch.setattr(attention, "torch_paged_attention", no_torch_path)
    # the short prompt decodes while the long one is still prefilled 16 tokens a step
    prompts = ["Hi", "A long story about ships and the sea and the wind " * 3]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompts, params, use_tqdm=False)
    layers = llm.engine.config.model.hf_config.text_config.num_hidden_layers
    mixed = [lens for lens in calls if 1 in lens and max(lens) > 1]
    assert layers >= 2 and len(mixed) >= 2 * layers  # at least two mixed steps, every layer
    monkeypatch.undo()
    torch_llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="torch", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    same = torch_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in same]
