"""Penalties, min_tokens, stop_token_ids and logprobs through the engine, against transformers
(float32, the same checkpoint)."""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM, SamplingParams
from tests.support.engine import assert_no_leaks

PROMPT = "USER: Tell me a story about a red cube. ASSISTANT:"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llava", seed=0)


@pytest.mark.parametrize("penalty", [4.0, 0.3])
def test_greedy_repetition_penalty_matches_transformers_generate(llm, reference, images, penalty):
    cases = [(PROMPT, []), ("USER: <image>\nWhat is in the picture? ASSISTANT:", images[:1])]
    params = SamplingParams(temperature=0, max_tokens=24, repetition_penalty=penalty)
    outs = llm.generate([{"prompt": p, "images": i} for p, i in cases], params, use_tqdm=False)
    for (prompt, imgs), out in zip(cases, outs, strict=True):
        inputs = reference.inputs(prompt, imgs)
        with torch.inference_mode():
            ref = reference.model.generate(
                **inputs, max_new_tokens=24, do_sample=False, repetition_penalty=penalty
            )
        expected = ref[0, inputs["input_ids"].shape[1] :].tolist()
        assert out.outputs[0].token_ids == expected, prompt
    if penalty < 1:  # the random tiny model rarely repeats; a reward for repeats must act
        plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        assert plain[0].outputs[0].token_ids != outs[0].outputs[0].token_ids
    assert_no_leaks(llm)


def test_logprobs_are_log_softmax_of_transformers_logits(llm, reference):
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=2)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 6
    ids = reference.inputs(PROMPT, [])["input_ids"][0].tolist() + out.token_ids
    with torch.inference_mode():
        logits = reference.model(input_ids=torch.tensor([ids])).logits[0].float()
    n = len(ids) - len(out.token_ids)
    expected = logits[n - 1 : -1].log_softmax(-1)
    for step, lp in enumerate(out.logprobs):
        assert lp.token_id == out.token_ids[step] and lp.rank == 1
        assert lp.logprob == pytest.approx(expected[step, lp.token_id].item(), abs=1e-4)
        top = expected[step].topk(2)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_min_tokens_and_stop_token_ids(llm):
    greedy = SamplingParams(temperature=0, max_tokens=12)
    first = llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids
    stop_at = first[3]
    stopped = llm.generate(
        PROMPT,
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0].outputs[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == first[: first.index(stop_at) + 1]
    held = llm.generate(
        PROMPT,
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at], min_tokens=8),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(held.token_ids) >= 8 and stop_at not in held.token_ids[:8]


def test_token_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(PROMPT, SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)


def _stop_cut_after_min_tokens(tokenizer, ids: list[int], stop: str, min_tokens: int):
    """vLLM's rule, token by token: the first stop string found in text that the tokens after
    the first ``min_tokens`` added (with ``len(stop) - 1`` characters of overlap before it)."""
    for k in range(min_tokens + 1, len(ids) + 1):
        before = tokenizer.decode(ids[: k - 1], skip_special_tokens=True)
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        cut = text.find(stop, max(0, len(before) - len(stop) + 1))
        if cut >= 0:
            return ids[:k], text[:cut]
    return None


def test_min_tokens_holds_back_stop_strings(llm):
    """A stop string in the first min_tokens tokens' text does not end the request (vLLM's
    test_min_tokens_with_stop); one in later text does, and cuts there."""
    min_tokens, held = 10, SamplingParams(temperature=0, max_tokens=40, min_tokens=10)
    full = llm.generate(PROMPT, held, use_tqdm=False)[0].outputs[0]
    tokenizer = llm.get_tokenizer()
    early = tokenizer.decode(full.token_ids[:2], skip_special_tokens=True).split()[-1]
    assert early in full.text
    plain = SamplingParams(temperature=0, max_tokens=40, stop=[early])
    assert len(llm.generate(PROMPT, plain, use_tqdm=False)[0].outputs[0].token_ids) <= 2
    params = SamplingParams(temperature=0, max_tokens=40, min_tokens=min_tokens, stop=[early])
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) > min_tokens
    expected = _stop_cut_after_min_tokens(tokenizer, full.token_ids, early, min_tokens)
    if expected is None:
        assert (out.token_ids, out.text, out.finish_reason) == (full.token_ids, full.text, "length")
    else:
        assert (out.token_ids, out.text, out.finish_reason) == (*expected, "stop")
    assert_no_leaks(llm)
