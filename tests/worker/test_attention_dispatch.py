"""Which attention path a step takes with the CPU kernel selected: the kernel for steps whose
every sequence has one query row (decode), the torch path's batched SDPA for any step with a
longer query (a prefill chunk; ``AttentionMetadata`` says why)."""

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


def test_a_steps_decode_rows_take_the_kernel_while_its_prefill_chunk_takes_sdpa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that prefills a chunk of one prompt while other sequences decode: the chunk's
    rows go to SDPA, the decode rows to the kernel (the torch path gathered every decode's
    keys into a padded copy)."""
    llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="cpu-kernel", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    kernel = attention.paged_attention_kernel()
    sdpa = attention.torch_paged_attention
    assert kernel is not None
    calls: list[tuple[str, int]] = []

    def kernel_rows() -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, *args: Any) -> torch.Tensor:
            query_lens = args[3].diff()
            assert bool((query_lens == 1).all()), "a prefill row reached the kernel"
            calls.append(("kernel", q.shape[0]))
            return kernel(q, *args)

        return run

    def sdpa_rows(*args: Any, **kwargs: Any) -> torch.Tensor:
        plan = args[5]
        calls.append(("sdpa decodes", plan.decode_token_idx.numel()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention, "paged_attention_kernel", kernel_rows)
    monkeypatch.setattr(attention, "torch_paged_attention", sdpa_rows)
    # the short prompt decodes while the long one is still prefilled 16 tokens a step
    prompts = ["Hi", "A long story about ships and the sea and the wind " * 3]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompts, params, use_tqdm=False)
    layers = llm.engine.config.model.hf_config.text_config.num_hidden_layers
    assert all(n == 0 for kind, n in calls if kind == "sdpa decodes")
    mixed = sum(a[0] == "sdpa decodes" and b[0] == "kernel" for a, b in itertools.pairwise(calls))
    assert layers >= 2 and mixed >= 2 * layers  # at least two mixed steps, every layer
    torch_llm = LLM(
        "tiny-llava", dtype="float32", attention_backend="torch", seed=0,
        max_num_batched_tokens=16,
    )  # fmt: skip
    same = torch_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in same]
