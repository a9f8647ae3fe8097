"""Greedy outputs of two engines compared: token identity (the float32 claim) and vLLM's
``check_logprobs_close`` rule (the half-precision claim): the greedy tokens are equal, or at
the first divergence each side's token is among the other's top-``k`` logprobs (the comparison
stops there). Used by the bfloat16 parity tests and the GPU run (``bench gpu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Sample = tuple[list[int], list[set[int]]]  # greedy tokens, each step's top-k token ids


@dataclass(frozen=True)
class Closeness:
    """How two greedy samples compare: ``equal_prefix`` leading tokens are equal;
    ``identical``: all of them (and the lengths); ``close``: vLLM's rule holds; ``detail``
    describes the first divergence, empty when there is none."""

    equal_prefix: int
    identical: bool
    close: bool
    detail: str = ""


def compare_samples(ours: Sample, theirs: Sample) -> Closeness:
    """``ours`` against ``theirs`` by the module's rule."""
    (our_tokens, our_top), (their_tokens, their_top) = ours, theirs
    for i, (a, b) in enumerate(zip(our_tokens, their_tokens, strict=False)):
        if a != b:
            missing = []
            if a not in their_top[i]:
                missing.append(f"ours {a} not in their top-{len(their_top[i])}")
            if b not in our_top[i]:
                missing.append(f"theirs {b} not in our top-{len(our_top[i])}")
            why = "; ".join(missing) or "tokens differ, each in the other's top logprobs"
            return Closeness(i, False, not missing, f"step {i}: {why}")
    same_length = len(our_tokens) == len(their_tokens)
    return Closeness(min(len(our_tokens), len(their_tokens)), same_length, True)


def mmserve_sample(output: Any) -> Sample:
    """The sample of an mmserve ``RequestOutput`` generated with ``logprobs=k``."""
    completion = output.outputs[0]
    if completion.logprobs is None:
        raise ValueError("mmserve_sample needs an output generated with SamplingParams(logprobs=k)")
    return list(completion.token_ids), [{t for t, _ in step.top} for step in completion.logprobs]


def transformers_sample(
    model: Any, inputs: dict[str, torch.Tensor], max_new_tokens: int, top: int
) -> Sample:
    """Greedy ``generate`` of a transformers model in its own dtype; each step's top-``top``
    of the raw logits (compared in float32). ``inputs`` are on the model's device."""
    with torch.inference_mode():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    tokens = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    tops = [set(step[0].float().topk(top).indices.tolist()) for step in out.logits]
    return tokens, tops
