"""The greedy-output comparison the bfloat16 parity tests and the GPU run share
(``mmserve.bench.lib.closeness``): identity, vLLM's top-k closeness rule, and its failures."""

from __future__ import annotations

import pytest

from mmserve.bench.lib.closeness import compare_samples, mmserve_sample


def test_equal_samples_are_identical_and_close() -> None:
    verdict = compare_samples(([1, 2, 3], [{1}, {2}, {3}]), ([1, 2, 3], [{1}, {2}, {3}]))
    assert (verdict.equal_prefix, verdict.identical, verdict.close, verdict.detail) == (
        3, True, True, "",
    )  # fmt: skip


def test_a_divergence_within_both_top_sets_is_close_and_stops_the_comparison() -> None:
    ours = ([1, 7, 9], [{1}, {7, 8}, {9}])
    theirs = ([1, 8, 5], [{1}, {8, 7}, {5}])  # step 2 would not be close: never compared
    verdict = compare_samples(ours, theirs)
    assert (verdict.equal_prefix, verdict.identical, verdict.close) == (1, False, True)
    assert verdict.detail.startswith("step 1: tokens differ")


def test_a_token_outside_the_other_top_set_is_not_close_and_says_which() -> None:
    verdict = compare_samples(([4, 6], [{4}, {6, 2}]), ([4, 5], [{4}, {5, 1}]))
    assert not verdict.close and verdict.equal_prefix == 1
    assert verdict.detail == "step 1: ours 6 not in their top-2; theirs 5 not in our top-2"


def test_a_shorter_sample_is_close_but_not_identical() -> None:
    verdict = compare_samples(([1, 2], [{1}, {2}]), ([1], [{1}]))
    assert (verdict.equal_prefix, verdict.identical, verdict.close) == (1, False, True)


def test_an_output_without_logprobs_is_a_clear_error() -> None:
    class Completion:
        token_ids, logprobs = [1], None

    class Output:
        outputs = [Completion()]

    with pytest.raises(ValueError, match="logprobs=k"):
        mmserve_sample(Output())
