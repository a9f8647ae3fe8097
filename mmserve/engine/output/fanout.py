"""``n > 1``: one request fanned out into ``n`` child requests, their outputs merged back.

The prompt is admitted once (tokenized, images decoded, hashed and preprocessed once); the
children share that ``ProcessedPrompt``. Child 0 leads: the others wait in the scheduler until
its prompt is scheduled through (``Request.waits_for_leader``), then find the prompt's full KV
blocks in the prefix cache and its images in the (content-addressed) encoder cache, so the
prompt is prefilled and encoded once. Only the prompt's partial last block is recomputed per
child (a prefix hit never covers the last prompt token, whose logits each child needs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mmserve.engine.outputs import CompletionOutput, RequestOutput
from mmserve.sampling_params import SamplingParams


def child_id(parent_id: str, index: int) -> str:
    return f"{index}_{parent_id}"  # vLLM's child request id format


def child_params(params: SamplingParams) -> list[SamplingParams]:
    """One ``n == 1`` params per child: child ``i`` samples with ``seed + i`` (when seeded);
    only child 0 computes prompt logprobs (they belong to the prompt, not to a choice)."""
    out = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        prompt_logprobs = params.prompt_logprobs if i == 0 else None
        out.append(dataclasses.replace(params, n=1, seed=seed, prompt_logprobs=prompt_logprobs))
    return out


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    child_ids: list[str]
    latest: list[CompletionOutput | None]
    first: RequestOutput | None = None  # child 0's newest output (cached tokens, prompt logprobs)
    errors: list[str] = field(default_factory=list)

    def output(self, arrival_time: float) -> RequestOutput:
        done = [c is not None and c.finish_reason is not None for c in self.latest]
        outputs = [
            c if c is not None else CompletionOutput(i, "", []) for i, c in enumerate(self.latest)
        ]
        first = self.first
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=first.prompt_token_ids if first is not None else [],
            outputs=outputs,
            finished=all(done) or bool(self.errors),
            num_cached_tokens=first.num_cached_tokens if first is not None else 0,
            metrics={"arrival_time": arrival_time},
            error=self.errors[0] if self.errors else None,
            prompt_logprobs=first.prompt_logprobs if first is not None else None,
            media_usage=first.media_usage if first is not None else [],
        )


class FanOut:
    """The live ``n > 1`` requests: which child belongs to which parent, at which index.

    Invariants: every live child id maps to one live parent; the parent's merged output is
    finished once every child has finished, or as soon as one child fails ("error"), which
    ends the parent (its other children are returned by ``merge`` to be aborted); a finished or
    aborted parent leaves no state here. Requests with ``n == 1`` never enter.
    """

    def __init__(self) -> None:
        self.parents: dict[str, _Parent] = {}
        self.child_of: dict[str, tuple[_Parent, int]] = {}

    def add(self, parent_id: str, n: int, prompt: str | None) -> list[str]:
        if parent_id in self.parents:
            raise ValueError(f"request id {parent_id!r} is already in use")
        ids = [child_id(parent_id, i) for i in range(n)]
        parent = _Parent(parent_id, prompt, ids, [None] * n)
        self.parents[parent_id] = parent
        for i, cid in enumerate(ids):
            self.child_of[cid] = (parent, i)
        return ids

    def expand(self, req_ids: list[str]) -> list[str]:
        """Parent ids replaced by their children's ids (the parents are forgotten)."""
        out = []
        for req_id in req_ids:
            parent = self.parents.get(req_id)
            if parent is None:
                out.append(req_id)
                continue
            self._forget(parent)
            out += parent.child_ids
        return out

    def _forget(self, parent: _Parent) -> None:
        self.parents.pop(parent.request_id, None)
        for cid in parent.child_ids:
            self.child_of.pop(cid, None)

    def merge(self, outputs: list[RequestOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Children's outputs -> one output per parent (others pass through), and the ids of
        children to abort because a sibling failed."""
        if not self.child_of:
            return outputs, []
        merged: list[RequestOutput] = []
        touched: dict[str, tuple[_Parent, float]] = {}
        for out in outputs:
            entry = self.child_of.get(out.request_id)
            if entry is None:
                merged.append(out)
                continue
            parent, index = entry
            parent.latest[index] = dataclasses.replace(out.outputs[0], index=index)
            if index == 0:
                parent.first = out
            if out.error is not None:
                parent.errors.append(out.error)
            arrival = out.metrics.get("arrival_time", 0.0)
            touched[parent.request_id] = (parent, arrival)
        to_abort: list[str] = []
        for parent, arrival in touched.values():
            result = parent.output(arrival)
            merged.append(result)
            if result.finished:
                to_abort += [
                    cid
                    for cid, c in zip(parent.child_ids, parent.latest, strict=True)
                    if c is None or c.finish_reason is None
                ]
                self._forget(parent)
        return merged, to_abort
