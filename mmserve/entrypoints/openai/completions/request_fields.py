"""Which request fields of vLLM's chat / completions protocol mmserve implements, and which it
refuses: the one place that decides, so that no field is ever silently ignored.

A field is either declared on the request model in ``protocol.py`` (implemented) or listed in
``REFUSED`` with the values that mean "feature off" (clients such as LangChain send
``"logprobs": false`` or ``"echo": false`` on every request; those pass). Any other value of a
refused field is a 400 whose ``param`` names the field. Names that are in neither place (not
part of vLLM's or OpenAI's protocol) are ignored with a log warning, as vLLM does.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

logger = logging.getLogger(__name__)

_OFF: tuple[Any, ...] = (None,)
_FALSE: tuple[Any, ...] = (None, False)
_TRUE: tuple[Any, ...] = (None, True)
_EMPTY: tuple[Any, ...] = (None, [], {}, "")

# field -> the values accepted as "not used" (vLLM's defaults for it)
REFUSED_COMMON: dict[str, tuple[Any, ...]] = {
    "use_beam_search": _FALSE,
    "length_penalty": (None, 1, 1.0),
    "include_stop_str_in_output": _FALSE,
    "skip_special_tokens": _TRUE,
    "spaces_between_special_tokens": _TRUE,
    "truncate_prompt_tokens": _OFF,
    "allowed_token_ids": _EMPTY,
    "bad_words": _EMPTY,
    "structural_tag": _EMPTY,
    "guided_decoding_backend": (None, "", "auto", "xgrammar"),
    "guided_whitespace_pattern": _EMPTY,
    "priority": (None, 0),
    "request_id": _OFF,
    "logits_processors": _EMPTY,
    "return_tokens_as_token_ids": _FALSE,
    "return_token_ids": _FALSE,
    "kv_transfer_params": _EMPTY,
    "vllm_xargs": _EMPTY,
    # OpenAI fields with no vLLM implementation either
    "metadata": _EMPTY,
    "store": _FALSE,
    "service_tier": (None, "auto", "default"),
}
REFUSED_CHAT: dict[str, tuple[Any, ...]] = {
    **REFUSED_COMMON,
    "functions": _EMPTY,
    "function_call": (None, "none", "auto"),
    "reasoning_effort": _OFF,
    "include_reasoning": _TRUE,
    "echo": _FALSE,
    "add_special_tokens": _FALSE,
    "documents": _EMPTY,
    "chat_template": _EMPTY,
    "modalities": (None, ["text"]),
    "audio": _OFF,
    "prediction": _OFF,
    "web_search_options": _OFF,
}
REFUSED_COMPLETION: dict[str, tuple[Any, ...]] = {
    **REFUSED_COMMON,
    "echo": _FALSE,
    "suffix": _EMPTY,
    "add_special_tokens": _TRUE,
    "prompt_embeds": _EMPTY,
    "mm_processor_kwargs": _EMPTY,  # completions take no images here
}
# best_of is accepted when it equals n (mmserve returns all n candidates it samples)
SAME_AS_N = ("best_of",)


def _is_off(value: Any, neutral: tuple[Any, ...]) -> bool:
    return value is None or any(type(value) is type(v) and value == v for v in neutral)


def unsupported_fields(req: BaseModel, refused: dict[str, tuple[Any, ...]]) -> list[str]:
    """Names of the undeclared fields ``req`` carries that mmserve cannot honour (-> 400)."""
    bad = []
    n = getattr(req, "n", 1)
    for name, value in (req.model_extra or {}).items():
        if name in SAME_AS_N:
            if value is not None and value != n:
                bad.append(name)
        elif name not in refused:
            logger.warning("ignoring the unknown request field %r", name[:64])
        elif not _is_off(value, refused[name]):
            bad.append(name)
    stream_options = getattr(req, "stream_options", None)
    if stream_options is not None and stream_options.continuous_usage_stats:
        bad.append("stream_options.continuous_usage_stats")
    return bad


def implemented_fields(model: type[BaseModel]) -> list[str]:
    """The fields ``model`` declares (and so implements), for documentation and tests."""
    return sorted(model.model_fields)
