"""``SamplingParams`` given a value of the wrong type: a ``ValueError`` naming the field and
the value at construction -- never a ``TypeError`` from a comparison, and never a wrong value
taken as it came (``ignore_eos="yes"``, ``max_tokens=16.5``). The spellings vLLM takes still
read as before: one stop string, tuples, ``None`` for the lists, OpenAI's string token ids in
``logit_bias``."""

from __future__ import annotations

import pytest

from mmserve.sampling_params import SamplingParams
from mmserve.structured_outputs import StructuredOutputsParams


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_tokens", "16"),
        ("max_tokens", 16.5),
        ("temperature", "0.5"),
        ("top_p", None),
        ("top_k", 2.5),
        ("n", "2"),
        ("seed", "x"),
        ("stop", 5),
        ("stop", ["ok", 5]),
        ("stop_token_ids", [1, "2"]),
        ("stop_token_ids", 7),
        ("ignore_eos", "yes"),
        ("presence_penalty", "1"),
        ("logprobs", "5"),
        ("logprobs", True),
        ("logit_bias", {"five": 1}),
        ("logit_bias", {5: "up"}),
        ("logit_bias", [5]),
        ("structured_outputs", {"json": {}}),
    ],
)
def test_a_value_of_the_wrong_type_is_a_value_error_naming_it(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=setting) as err:
        SamplingParams(**{setting: value})
    assert repr(value) in str(err.value)


def test_the_spellings_vllm_takes_read_as_before() -> None:
    params = SamplingParams(
        temperature=0, stop="END", stop_token_ids=(1, 2), logit_bias={"5": 1, 7: -300.0}
    )
    assert params.temperature == 0 and params.greedy
    assert params.stop == ["END"] and params.stop_token_ids == [1, 2]
    assert params.logit_bias == {5: 1.0, 7: -100.0}
    empty = SamplingParams(stop=None, stop_token_ids=None, logit_bias=None)
    assert empty.stop == [] and empty.stop_token_ids == [] and empty.logit_bias == {}
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    choice = StructuredOutputsParams(choice=["yes", "no"])
    assert SamplingParams(structured_outputs=choice).structured_outputs is choice
