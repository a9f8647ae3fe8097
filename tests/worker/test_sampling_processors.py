"""The batched logits processors against transformers' logits processors on the same logits,
and the sampler's fast path / logprobs."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from mmserve.sampling_params import SamplingParams
from mmserve.worker.logits_processors import TokenHistory, apply_min_p, process_logits
from mmserve.worker.sampler import sample

VOCAB = 50
EOS = frozenset({2})


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _history(seed: int, prompt: int = 12, output: int = 9) -> TokenHistory:
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, VOCAB, (prompt + output,), generator=g).tolist()
    return TokenHistory(ids, prompt)


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty: float) -> None:
    logits, hists = _logits(3), [_history(i) for i in range(3)]
    params = [SamplingParams(repetition_penalty=penalty) for _ in hists]
    ours = process_logits(logits, params, hists, EOS)
    ref = RepetitionPenaltyLogitsProcessor(penalty)
    for r, h in enumerate(hists):
        expected = ref(torch.tensor([h.token_ids]), logits[r : r + 1].clone())
        torch.testing.assert_close(ours[r : r + 1], expected, rtol=0, atol=0)


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.9])
def test_min_p_matches_transformers(min_p: float) -> None:
    logits = _logits(4, seed=1)
    expected = MinPLogitsWarper(min_p)(torch.zeros(4, 1, dtype=torch.long), logits.clone())
    assert torch.equal(apply_min_p(logits, min_p), expected)


def test_min_tokens_matches_transformers() -> None:
    logits = _logits(2, seed=2)
    hists = [_history(0, prompt=12, output=3), _history(1, prompt=12, output=3)]
    params = [SamplingParams(min_tokens=5, max_tokens=8), SamplingParams(min_tokens=3)]
    ours = process_logits(logits, params, hists, EOS)
    ref = MinNewTokensLengthLogitsProcessor(12, 5, eos_token_id=sorted(EOS))
    expected0 = ref(torch.tensor([hists[0].token_ids]), logits[:1].clone())
    assert torch.equal(ours[:1], expected0)
    assert ours[0, 2] == float("-inf")
    assert torch.equal(ours[1], logits[1])  # min_tokens reached: EOS allowed again


def test_min_tokens_masks_stop_token_ids_but_not_eos_with_ignore_eos() -> None:
    logits = _logits(1, seed=3)
    params = [SamplingParams(min_tokens=4, stop_token_ids=[7, 9], ignore_eos=True)]
    ours = process_logits(logits, params, [_history(0, output=0)], EOS)
    assert ours[0, 7] == ours[0, 9] == float("-inf")
    assert ours[0, 2] == logits[0, 2]


def test_logit_bias_matches_transformers_sequence_bias() -> None:
    logits = _logits(2, seed=4)
    bias = {3: 5.0, 11: -100.0, 40: 0.25}
    params = [SamplingParams(logit_bias=bias), SamplingParams()]
    ours = process_logits(logits, params, [_history(0), _history(1)], EOS)
    ref = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})
    expected = ref(torch.tensor([_history(0).token_ids]), logits[:1].clone())
    torch.testing.assert_close(ours[:1], expected)
    assert torch.equal(ours[1], logits[1])


def test_logit_bias_is_clamped_and_validated() -> None:
    assert SamplingParams(logit_bias={"5": 300}).logit_bias == {5: 100.0}  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={VOCAB: 1.0}).check_token_ids(VOCAB)


def test_presence_and_frequency_penalties_count_output_tokens_only() -> None:
    logits = _logits(1, seed=5)
    hist = TokenHistory([4, 4, 4, 8, 8, 1], num_prompt_tokens=3)  # output: 8, 8, 1
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=1.5)]
    ours = process_logits(logits, params, [hist], EOS)
    expected = logits.clone()
    expected[0, 8] -= 0.5 + 2 * 1.5
    expected[0, 1] -= 0.5 + 1.5
    torch.testing.assert_close(ours, expected)  # token 4 is only in the prompt: untouched


def test_mixed_batch_processes_only_the_rows_that_ask() -> None:
    logits = _logits(3, seed=6)
    hists = [_history(i) for i in range(3)]
    params = [SamplingParams(), SamplingParams(repetition_penalty=1.5), SamplingParams()]
    ours = process_logits(logits, params, hists, EOS)
    assert torch.equal(ours[0], logits[0]) and torch.equal(ours[2], logits[2])
    assert not torch.equal(ours[1], logits[1])


def test_plain_batch_needs_no_histories_and_returns_no_logprobs() -> None:
    logits = _logits(2, seed=7)
    out = sample(logits, [SamplingParams(temperature=0)] * 2, [None, None], histories=None)
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs == []


def test_greedy_uses_penalized_logits() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 3.0, 2.0
    params = [SamplingParams(temperature=0, repetition_penalty=2.0)]
    out = sample(logits, params, [None], [TokenHistory([5], 1)])
    assert out.token_ids == [6]


def test_logprobs_are_raw_log_softmax_with_rank_and_top() -> None:
    logits = _logits(2, seed=8)
    params = [SamplingParams(temperature=0, logprobs=3, repetition_penalty=3.0), SamplingParams()]
    out = sample(logits, params, [None, None], [_history(0), _history(1)])
    raw = logits.log_softmax(-1)
    lp = out.logprobs[0]
    assert lp is not None and out.logprobs[1] is None
    assert lp.token_id == out.token_ids[0]
    assert lp.logprob == pytest.approx(raw[0, lp.token_id].item(), abs=1e-6)
    assert lp.rank == int((raw[0] > raw[0, lp.token_id]).sum()) + 1
    top_ids = raw[0].topk(3).indices.tolist()
    assert [t for t, _ in lp.top] == top_ids
    assert [v for _, v in lp.top] == pytest.approx(raw[0, top_ids].tolist(), abs=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"repetition_penalty": 0},
        {"min_p": 1.5},
        {"min_tokens": 20, "max_tokens": 10},
        {"logprobs": 21},
        {"stop_token_ids": [-1]},
    ],
)
def test_invalid_values_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)
