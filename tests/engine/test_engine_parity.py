"""Greedy output of mmserve equals transformers' generate on the same checkpoint (float32)."""

from __future__ import annotations

import pytest

from mmserve import LLM, SamplingParams
from tests.support.engine import assert_no_leaks, attention_backends

MAX_NEW = 32
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)


def prompt_with(n_images: int, question: str = "What is in the picture?") -> str:
    return "USER: " + "<image>\n" * n_images + question + " ASSISTANT:"


def check_parity(llm: LLM, reference, cases: list[tuple[str, list]]) -> None:
    outs = llm.generate(
        [{"prompt": p, "images": imgs} for p, imgs in cases], GREEDY, use_tqdm=False
    )
    for (prompt, imgs), out in zip(cases, outs, strict=True):
        expected_ids = reference.inputs(prompt, imgs)["input_ids"][0].tolist()
        assert out.prompt_token_ids == expected_ids
        assert out.outputs[0].token_ids == reference.greedy(prompt, imgs, MAX_NEW), prompt
    assert_no_leaks(llm)


BACKENDS = attention_backends()


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request) -> LLM:
    return LLM(
        "tiny-llava",
        max_num_batched_tokens=2048,
        max_num_seqs=64,
        seed=0,
        attention_backend=request.param,
    )


def test_text_only(llm, reference):
    check_parity(llm, reference, [("USER: Tell me a story about a red cube. ASSISTANT:", [])])


def test_one_image(llm, reference, images):
    check_parity(llm, reference, [(prompt_with(1), images[:1])])


def test_three_images(llm, reference, images):
    check_parity(llm, reference, [(prompt_with(3, "Compare them."), images[:3])])


def test_batch_of_eight_mixed(llm, reference, images):
    cases = [
        (prompt_with(1, "Describe it."), [images[0]]),
        ("USER: Which color is the sky? ASSISTANT:", []),
        (prompt_with(2, "Which is brighter?"), [images[1], images[2]]),
        ("plain text without a template", []),
        (prompt_with(1, "Count the shapes."), [images[3]]),
        (prompt_with(3, "Any difference?"), [images[2], images[0], images[1]]),
        ("USER: Hello! ASSISTANT:", []),
        (prompt_with(1, "Describe it."), [images[0]]),
    ]
    check_parity(llm, reference, cases)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget", [100, 37])
def test_image_split_across_chunks(reference, images, budget, backend):
    llm = LLM(
        "tiny-llava", max_num_batched_tokens=budget, max_num_seqs=4, attention_backend=backend
    )
    cases = [(prompt_with(2, "What changed?"), images[:2]), (prompt_with(1), [images[3]])]
    check_parity(llm, reference, cases)


@pytest.mark.parametrize("backend", BACKENDS)
def test_preemption(reference, images, backend):
    # Prompts of ~270 tokens take 17 blocks each: two fit in 35 blocks, but their decodes
    # soon need an 18th block each, so the newer one is preempted and recomputed.
    llm = LLM(
        "tiny-llava",
        num_kv_blocks=35,
        block_size=16,
        max_model_len=560,
        max_num_batched_tokens=512,
        attention_backend=backend,
    )
    cases = [(prompt_with(1, f"Question {i}?"), [images[i]]) for i in range(4)]
    check_parity(llm, reference, cases)
    assert llm.get_metrics()["num_preemptions"] > 0
