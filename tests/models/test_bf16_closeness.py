"""bfloat16 on CPU: mmserve against transformers in bfloat16 on the same machine, by vLLM's
``check_logprobs_close`` rule: the greedy tokens are equal, or at the first divergence each
side's token is among the other's top-5 logprobs (the comparison stops there). Rounding in
bfloat16 differs between any two implementations, so token identity is not expected (float32
parity stays token-identical: test_engine_parity, test_qwen2_vl)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mmserve.worker.model_runner as model_runner
from mmserve import LLM, SamplingParams
from mmserve.bench.lib.closeness import (
    Sample,
    compare_samples,
    mmserve_sample,
    transformers_sample,
)
from tests.conftest import Reference, make_image
from tests.models.test_qwen2_vl import QwenReference, chat_prompt
from tests.support.engine import attention_backends

MAX_NEW = 16
TOP = 5
BF16_GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, logprobs=TOP)


def check_logprobs_close(ours: Sample, theirs: Sample, name: str) -> int:
    """vLLM's rule (``compare_samples``); returns how many leading tokens are equal."""
    verdict = compare_samples(ours, theirs)
    assert verdict.close, f"{name}: {verdict.detail}"
    return verdict.equal_prefix


def mmserve_samples(llm: LLM, cases: list[tuple[str, list]]) -> list[Sample]:
    outs = llm.generate([{"prompt": p, "images": i} for p, i in cases], BF16_GREEDY, use_tqdm=False)
    return [mmserve_sample(out) for out in outs]


@pytest.fixture(scope="module")
def images() -> list:
    return [make_image(seed) for seed in (11, 12)]


@pytest.fixture(scope="module")
def llava_reference() -> Reference:
    ref = Reference("tiny-llava")
    ref.model.to(torch.bfloat16)  # the float32 checkpoint rounded as dtype=bfloat16 loads it
    return ref


@pytest.mark.parametrize("backend", attention_backends())
def test_tiny_llava_in_bf16_is_close_to_transformers_in_bf16(
    backend: str, llava_reference: Reference, images: list
) -> None:
    llm = LLM("tiny-llava", dtype="bfloat16", attention_backend=backend, seed=0)
    assert next(llm.engine.model.parameters()).dtype == torch.bfloat16
    cases = [
        ("USER: <image>\nWhat is in the picture? ASSISTANT:", images[:1]),
        ("USER: <image>\n<image>\nCompare the two. ASSISTANT:", images),
        ("USER: Tell me a story about a cat. ASSISTANT:", []),
    ]
    equal = 0
    for (prompt, imgs), ours in zip(cases, mmserve_samples(llm, cases), strict=True):
        theirs = transformers_sample(
            llava_reference.model, llava_reference.inputs(prompt, imgs), MAX_NEW, TOP
        )
        equal += check_logprobs_close(ours, theirs, prompt)
    # not vacuous: some tokens agree (tiny random models have near-flat logits, so bf16
    # rounding meets near-ties early: e.g. transformers' bf16 logits tie where float32 has a
    # clear top token and mmserve's float32-accumulated ones keep it)
    assert equal > 0


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2.5-vl"])
def test_tiny_qwen_vl_in_bf16_is_close_to_transformers_in_bf16(model: str, images: list) -> None:
    ref = QwenReference(model)
    ref.model.to(torch.bfloat16)
    llm = LLM(model, dtype="bfloat16", seed=0)
    cases = [(chat_prompt(1), images[:1]), (chat_prompt(2, "Compare them."), images),
             (chat_prompt(0, "Count to ten."), [])]  # fmt: skip
    equal = 0
    for (prompt, imgs), ours in zip(cases, mmserve_samples(llm, cases), strict=True):
        inputs = {k: v.to(ref.device) for k, v in ref.inputs(prompt, imgs).items()}
        equal += check_logprobs_close(
            ours, transformers_sample(ref.model, inputs, MAX_NEW, TOP), prompt
        )
    assert equal > 0


def test_a_bf16_engine_samples_from_float32_logits(monkeypatch) -> None:
    seen: list[torch.dtype] = []
    real_sample = model_runner.sample

    def spy(logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(logits.dtype)
        return real_sample(logits, *args, **kwargs)

    monkeypatch.setattr(model_runner, "sample", spy)
    llm = LLM("tiny-llava", dtype="bfloat16", seed=0)
    llm.generate(["USER: hi ASSISTANT:"], SamplingParams(temperature=0, max_tokens=3))
    assert seen and set(seen) == {torch.float32}
