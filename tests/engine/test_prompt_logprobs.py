"""``prompt_logprobs`` through the engine: log-softmax of transformers' logits at every prompt
position (image placeholders included), whole or in prefill chunks, never from a prefix hit."""

from __future__ import annotations

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.request import Request
from mmserve.sampling_params import TokenLogprobs
from tests.support.engine import assert_no_leaks

PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"


def _expected(reference, images) -> tuple[list[int], torch.Tensor]:
    inputs = reference.inputs(PROMPT, images)
    with torch.inference_mode():
        logits = reference.model(**inputs).logits[0].float()
    return inputs["input_ids"][0].tolist(), logits.log_softmax(-1)


def _check(out, ids: list[int], expected: torch.Tensor, num_top: int) -> None:
    assert out.prompt_token_ids == ids
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(ids) - 1
    assert [lp.token_id for lp in lps] == ids[1:]
    values = torch.tensor([lp.logprob for lp in lps])
    want = expected[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    torch.testing.assert_close(values, want, atol=1e-4, rtol=0)
    # rank: 1 + how many tokens are more likely (ties within float noise may go either way)
    lo = (expected[:-1] > want.unsqueeze(1) + 1e-4).sum(-1) + 1
    hi = (expected[:-1] > want.unsqueeze(1) - 1e-4).sum(-1) + 1
    ranks = torch.tensor([lp.rank for lp in lps])
    assert bool(((lo <= ranks) & (ranks <= hi)).all())
    top = expected[:-1].topk(num_top, dim=-1)
    for pos in (0, len(lps) // 2, len(lps) - 1):
        assert [t for t, _ in lps[pos].top] == top.indices[pos].tolist()
        assert [v for _, v in lps[pos].top] == pytest.approx(top.values[pos].tolist(), abs=1e-4)


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 64])
def test_prompt_logprobs_match_transformers_and_skip_the_prefix_cache(
    reference, images, max_num_batched_tokens
):
    llm = LLM("tiny-llava", seed=0, max_num_batched_tokens=max_num_batched_tokens)
    request = {"prompt": PROMPT, "images": [images[0]]}
    warm = llm.generate(request, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert warm.prompt_logprobs is None
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    out = llm.generate(request, params, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0  # the warm prompt's blocks are cached, yet not used
    ids, expected = _expected(reference, [images[0]])
    _check(out, ids, expected, 3)
    assert out.outputs[0].token_ids == warm.outputs[0].token_ids
    assert_no_leaks(llm)


def test_prompt_logprobs_with_n_come_once_and_the_children_share_the_prompt(reference, images):
    llm = LLM("tiny-llava", seed=0)
    request = {"prompt": PROMPT, "images": [images[1]]}
    params = SamplingParams(temperature=0, max_tokens=3, n=2, prompt_logprobs=0)
    out = llm.generate(request, params, use_tqdm=False)[0]
    ids, expected = _expected(reference, [images[1]])
    _check(out, ids, expected, 0)
    assert len(out.outputs) == 2 and out.outputs[0].token_ids == out.outputs[1].token_ids
    assert llm.get_metrics()["prefix_cache_hits"] == (len(ids) - 1) // 16 * 16
    assert_no_leaks(llm)


def test_recomputed_prompt_chunks_do_not_add_entries_twice() -> None:
    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(prompt_logprobs=0))
    request.add_prompt_logprobs(0, [TokenLogprobs(2, -1.0, 1), TokenLogprobs(3, -1.0, 1)])
    recomputed = [TokenLogprobs(t, -2.0, 1) for t in (2, 3, 4)]  # preempted, prefilled again
    request.add_prompt_logprobs(0, recomputed)
    request.add_prompt_logprobs(3, [TokenLogprobs(5, -1.0, 1)])
    assert [e.token_id for e in request.prompt_logprobs] == [2, 3, 4, 5]
    assert [e.logprob for e in request.prompt_logprobs] == [-1.0, -1.0, -2.0, -1.0]
