"""Pydantic models of the OpenAI-compatible API (the subset mmserve serves).

Requests ignore unknown fields (like OpenAI's SDK extras); fields whose semantics mmserve
does not implement are rejected with 400 by ``unsupported_fields`` instead of being ignored.
vLLM extensions accepted: ``top_k`` (-1 or 0 disables), ``ignore_eos``, per-part ``uuid``,
``cache_salt`` (scopes prefix- and encoder-cache hits to requests with the same salt).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str
    uuid: str | None = None  # stable id replacing the content hash as the encoder-cache key


ContentPart = Annotated[TextPart | ImageURLPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(_Request):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    max_tokens: int | None = None
    # accepted only at their neutral values (see unsupported_fields)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    user: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    # vLLM's chat-template fields (see entrypoints.chat_utils.ChatOptions)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the newer name) wins over ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def unsupported_fields(req: _SamplingFields) -> list[str]:
    """Names of fields set to something mmserve cannot honour (-> 400)."""
    bad = []
    if req.presence_penalty:
        bad.append("presence_penalty")
    if req.frequency_penalty:
        bad.append("frequency_penalty")
    if req.logit_bias:
        bad.append("logit_bias")
    if req.logprobs not in (None, False, 0):
        bad.append("logprobs")
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs:
            bad.append("top_logprobs")
        if req.tools:
            bad.append("tools")
        if req.tool_choice not in (None, "none", "auto"):
            bad.append("tool_choice")
        if req.response_format and req.response_format.get("type", "text") != "text":
            bad.append("response_format")
    if isinstance(req, CompletionRequest):
        if req.echo:
            bad.append("echo")
        if req.suffix:
            bad.append("suffix")
        if req.best_of not in (None, 1):
            bad.append("best_of")
    return bad


# ---- responses (chat / completion bodies are built as dicts in ``serving``) --------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "mmserve"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
