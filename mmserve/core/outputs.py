"""The only contract between the scheduler (core/) and the worker (worker/).

Plain dataclasses, no tensors: pixel data travels as an opaque object the worker converts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mmserve.inputs import MultiModalItem
from mmserve.sampling_params import SamplingParams, TokenLogprobs

if TYPE_CHECKING:
    from mmserve.request import Request


@dataclass
class NewRequestData:
    """A request the worker has not seen (or sees again after preemption)."""

    req_id: str
    token_ids: list[int]
    mm_items: list[MultiModalItem]  # the request's own list (its in-place changes reach here)
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int | None = None  # None: every token is prompt

    @classmethod
    def of(cls, request: Request, block_ids: list[int]) -> NewRequestData:
        """Everything the worker needs to run ``request`` from its computed position."""
        return cls(
            req_id=request.req_id,
            token_ids=list(request.all_token_ids),
            mm_items=request.mm_items,
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            num_prompt_tokens=request.num_prompt_tokens,
        )


@dataclass
class CachedRequestData:
    """A request the worker already tracks: only what changed since the last step."""

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    # req_id -> number of tokens to run this step, starting at its num_computed_tokens.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # req_id -> indices of its mm_items to encode this step (deduplicated by hash across requests).
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    # req_id -> indices of its mm_items to load from their ``stored`` embedding (no encoder
    # work; the worker encodes an item whose stored embedding does not fit its placeholder).
    scheduled_encoder_loads: dict[str, list[int]] = field(default_factory=dict)
    # Encoder-cache keys evicted since the last step: the worker drops their tensors first.
    freed_encoder_keys: list[str] = field(default_factory=list)
    # Requests that ended (finished, aborted) since the last step: forget all their state.
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests preempted since the last step: drop their state but keep their sampling RNG, so a
    # seeded request continues its random stream when it comes back (as a new request).
    preempted_req_ids: set[str] = field(default_factory=set)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class ModelRunnerOutput:
    # req_id -> sampled token, only for requests whose chunk reached the end of their tokens.
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    # req_id -> logprobs of its sampled token, for requests with ``SamplingParams.logprobs``.
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    # req_id -> (first, logprobs of prompt tokens first + 1, first + 2, ...) computed this step,
    # for requests with ``SamplingParams.prompt_logprobs``.
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    encoder_seconds: float = 0.0
    num_images_encoded: int = 0
    # item keys the worker encoded though the step loaded them or found them cached (a stored
    # embedding that did not fit its placeholder, a gather miss)
    encoded_instead: frozenset[str] = frozenset()
