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


@dataclass(frozen=True)
class MediaUsage:
    """How one image or video of a prompt got its embeddings (the OpenAI usage's
    ``mm_inputs``). ``pieces`` counts its encoder items (one for an image; one per video frame
    group or pan-and-scan crop) by source label; ``source`` is the costliest of them:
    ``encoded`` > ``encoder_store`` > ``encoder_cache`` > ``prefix_cache`` (``not_computed``
    for pieces a request that ended early never reached)."""

    modality: str  # "image" | "video"
    index: int  # among the prompt's inputs of that modality, in prompt order
    tokens: int  # its placeholder tokens in the prompt
    source: str
    pieces: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return {
            "type": self.modality,
            "index": self.index,
            "tokens": self.tokens,
            "source": self.source,
            "pieces": dict(self.pieces),
        }


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
    media_usage: list[MediaUsage] = field(default_factory=list)  # set on the finished output
