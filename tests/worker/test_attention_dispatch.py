"""Which attention path a step takes with the CPU kernel selected: the kernel for steps whose
every sequence has one query row (decode), the torch path's batched SDPA for any step with a
longer query (a prefill chunk), where the kernel is 9-18x slower (``flat_batch.py``)."""

from __future__ import annotations

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
