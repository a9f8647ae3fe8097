"""What the engine returns to callers."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.sampling_params import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None: running
    logprobs: list[TokenLogprobs] | None = None  # one per token id, if the request asked


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why the request failed (finish_reason "error")
    # one per prompt token after the first (the first has none), if the request asked
    prompt_logprobs: list[TokenLogprobs] | None = None
