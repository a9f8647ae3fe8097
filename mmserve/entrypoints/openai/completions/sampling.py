"""A request's sampling fields -> ``SamplingParams``: validated before any image is loaded,
unset fields from the generation config's defaults, ``max_tokens`` sized once the prompt's
length is known (the room left in the context by default; an explicit value that does not fit
is an error, as with OpenAI / vLLM)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.setup.generation_defaults import (
    build_sampling_params,
    default_max_tokens,
    merge_defaults,
)
from mmserve.entrypoints.openai.completions.protocol import ChatCompletionRequest, CompletionRequest
from mmserve.entrypoints.openai.completions.request_fields import (
    REFUSED_CHAT,
    REFUSED_COMPLETION,
    unsupported_fields,
)
from mmserve.entrypoints.openai.http.errors import APIError
from mmserve.sampling_params import SamplingParams
from mmserve.structured_outputs import StructuredOutputsParams

AnyRequest = ChatCompletionRequest | CompletionRequest
_SAMPLING = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "prompt_logprobs",
    "n",
}


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys (strings)."""
    out = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
    return out


def stops_of(req: AnyRequest) -> list[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


def sampling_factory(
    engine: AsyncLLMEngine,
    req: AnyRequest,
    constraint: tuple[str, StructuredOutputsParams] | None = None,
) -> Callable[[int], SamplingParams]:
    """Validate the sampling fields now; size max_tokens once the prompt length is known."""
    max_seqs = engine.engine.config.scheduler.max_num_seqs
    if req.n > max_seqs:
        raise APIError(400, f"n must be <= max_num_seqs ({max_seqs}), got {req.n}", param="n")
    if req.stream and req.prompt_logprobs is not None:
        raise APIError(
            400, "prompt_logprobs are not available when stream=true", param="prompt_logprobs"
        )
    refused = REFUSED_CHAT if isinstance(req, ChatCompletionRequest) else REFUSED_COMPLETION
    bad = unsupported_fields(req, refused)
    if bad:
        raise APIError(
            400, f"mmserve does not support the field(s): {', '.join(bad)}", param=bad[0]
        )
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    requested = req.requested_max_tokens
    defaults = engine.generation_defaults
    sampled = merge_defaults(
        {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": req.min_p,
            "repetition_penalty": req.repetition_penalty,
        },
        defaults,
    )
    if sampled.get("top_k") == -1:
        sampled["top_k"] = 0
    try:
        base = build_sampling_params(
            {
                **sampled,
                "max_tokens": requested,
                "min_tokens": req.min_tokens,
                "seed": req.seed,
                "stop": stops_of(req),
                "stop_token_ids": req.stop_token_ids or [],
                "ignore_eos": req.ignore_eos,
                "presence_penalty": req.presence_penalty or 0.0,
                "frequency_penalty": req.frequency_penalty or 0.0,
                "logit_bias": _logit_bias(req.logit_bias),
                "logprobs": req.num_logprobs,
                "prompt_logprobs": req.prompt_logprobs,
                "n": req.n,
                "structured_outputs": constraint[1] if constraint else None,
            }
        )
        base.check_token_ids(engine.engine.vocab_size)
    except ValueError as exc:  # messages start with the field name ("top_p must be ...")
        field = str(exc).split(" ", 1)[0]
        if field == "logprobs" and isinstance(req, ChatCompletionRequest):
            field = "top_logprobs"
        raise APIError(400, str(exc), param=field if field in _SAMPLING else None) from None
    max_len = engine.max_model_len

    def factory(num_prompt_tokens: int) -> SamplingParams:
        room = max_len - num_prompt_tokens
        if requested is None:
            cap = defaults.get("max_tokens")
            room = default_max_tokens(max_len, num_prompt_tokens, cap)
            return dataclasses.replace(base, max_tokens=room)
        if requested > room:
            raise ValueError(
                f"This model's maximum context length is {max_len} tokens. However, you"
                f" requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in"
                f" the prompt, {requested} for the completion). Reduce the prompt or"
                " max_tokens."
            )
        return base

    return factory
