"""Per-request sampling settings, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mmserve.arg_values import check_field_types
from mmserve.structured_outputs import StructuredOutputsParams

GREEDY_EPS = 1e-5  # temperatures below this sample greedily (their softmax over/underflows)
MAX_LOGPROBS = 20  # the most top alternatives a request may ask for (OpenAI's and vLLM's cap)
LOGIT_BIAS_LIMIT = 100.0  # biases are clamped to [-100, 100], as OpenAI and vLLM do


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` means greedy.

    Penalties follow vLLM: ``repetition_penalty`` (HF style: positive logits divided, negative
    multiplied) counts prompt and output tokens, ``presence_penalty`` / ``frequency_penalty``
    (OpenAI style, subtracted) count output tokens only. ``min_tokens`` masks EOS and
    ``stop_token_ids`` (and defers stop strings) until that many tokens are generated.
    ``n``: how many completions to sample for the prompt (the engine fans out ``n`` child
    requests sharing the prompt's KV blocks and image embeddings; with ``seed``, child ``i``
    uses ``seed + i``, so the whole result is reproducible; greedy gives ``n`` equal choices).
    ``logprobs``: how many top alternatives to return per generated token (0 = only the sampled
    token's), ``prompt_logprobs`` the same per prompt token; both are log-softmax of the raw
    model logits (vLLM's default ``raw_logprobs`` mode), before penalties and temperature.
    ``structured_outputs`` constrains the output (JSON schema, regex, choice, grammar); its
    token mask is applied to the logits first, as in vLLM.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = None  # None: the room left in the context (see generation_defaults)
    min_tokens: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        """vLLM's spellings normalised (one stop string, tuples or None for the lists, OpenAI's
        string token ids), then every field's type checked (``arg_values``) and its range:
        ValueError naming the field."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = _as_list(self.stop)
        self.stop_token_ids = _as_list(self.stop_token_ids)
        self.logit_bias = _read_logit_bias(self.logit_bias)
        check_field_types(self)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must be in [-2**63, 2**64), got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or (
            self.max_tokens is not None and self.min_tokens > self.max_tokens
        ):
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and 0 < self.repetition_penalty):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")
        if any(not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def needs_logits_processing(self) -> bool:
        """True when the sampler must touch this row's logits beyond temperature/top-k/top-p;
        a batch where no row does takes the plain (fast) path."""
        return bool(self.uses_penalties or self.logit_bias or self.min_tokens or self.min_p)

    def check_token_ids(self, vocab_size: int) -> None:
        """ValueError naming the field when a token id is outside the model's vocabulary."""
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = sorted(t for t in ids if not 0 <= t < vocab_size)
            if bad:
                raise ValueError(
                    f"{name} has token id(s) {bad[:5]} outside the vocabulary (size {vocab_size})"
                )


def _as_list(value: Any) -> Any:
    """A tuple or None as a list; anything else as given, for the type check to judge."""
    return [] if value is None else list(value) if isinstance(value, tuple) else value


def _read_logit_bias(value: Any) -> Any:
    """Token id (an int, or its digits as OpenAI's JSON sends them) -> bias clamped to
    [-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT]; None is no bias; a non-dict is left for the type
    check."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        return value
    biases = {}
    for token, bias in value.items():
        token_id = token if isinstance(token, int) else None
        if isinstance(token, str) and token.strip().lstrip("-").isdigit():
            token_id = int(token)
        if token_id is None or isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise ValueError(
                f"logit_bias must map token ids to numbers, got {token!r}: {bias!r} in {value!r}"
            )
        biases[token_id] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(bias)))
    return biases


@dataclass
class TokenLogprobs:
    """One generated token's log-probability, its rank (1 = most likely) and the top
    alternatives as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)
