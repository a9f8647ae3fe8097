"""Pydantic models of the OpenAI-compatible API (the subset mmserve serves).

Only implemented fields are declared here; anything else a request carries lands in
``model_extra`` and ``request_fields.unsupported_fields`` answers it with a 400 naming it (vLLM
fields mmserve does not implement are accepted only at their neutral values), so nothing is
silently ignored. vLLM extensions implemented: ``top_k`` (-1 or 0 disables), ``min_p``,
``repetition_penalty``, ``min_tokens``, ``stop_token_ids``, ``ignore_eos``, per-part ``uuid``,
``cache_salt`` (scopes prefix- and encoder-cache hits to requests with the same salt),
``prompt_logprobs``, ``mm_processor_kwargs`` (chat), ``video_url`` content parts,
``image_embeds`` content parts (with ``--enable-mm-embeds``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mmserve.entrypoints.openai.completions.structured_fields import (
    ResponseFormat,
    StructuredOutputsField,
)
from mmserve.entrypoints.openai.completions.tool_calls import ChatTool, ToolChoice


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields are refused, not ignored


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURLPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str | None = None  # None: ``uuid`` names an image sent before
    uuid: str | None = None  # stable id replacing the content hash as the encoder-cache key


class VideoURL(BaseModel):
    url: str


class VideoURLPart(BaseModel):
    type: Literal["video_url"]
    video_url: VideoURL | str
    uuid: str | None = None  # refused (not supported for videos), not ignored


class ImageEmbedsValue(BaseModel):
    image_embeds: str  # base64 of a torch.save'd tensor
    image_grid_thw: str | list[int] | list[list[int]] | None = None  # Qwen-VL: base64 or list


class ImageEmbedsPart(BaseModel):
    """vLLM's ``image_embeds`` part: served only with ``--enable-mm-embeds``."""

    type: Literal["image_embeds"]
    image_embeds: str | ImageEmbedsValue
    uuid: str | None = None  # refused (keyed by content), not ignored


ContentPart = Annotated[
    TextPart | ImageURLPart | VideoURLPart | ImageEmbedsPart, Field(discriminator="type")
]


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class AssistantToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # a tool turn: which call it answers


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension, refused when true


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
    min_tokens: int = 0
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = None
    user: str | None = None  # OpenAI's end-user id: informational, no effect on generation
    prompt_logprobs: int | None = None  # vLLM: logprobs of the prompt tokens (not streamed)
    # output constraints (see structured_fields; at most one per request)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # vLLM's chat-template fields (see entrypoints.chat_utils.ChatOptions)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # image processor settings for this request's images (checked per architecture)
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives per token, or None for no logprobs (``top_logprobs`` needs
        ``logprobs: true``, as with OpenAI)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the newer name) wins over ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


# ---- responses (chat / completion bodies are built as dicts in ``serving``) --------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class MediaInputUsage(BaseModel):
    """mmserve's extension (docs/serving.md, ``usage.mm_inputs``): how one image / video got its
    embeddings."""

    type: Literal["image", "video"]
    index: int
    tokens: int
    source: str  # encoded | encoder_store | encoder_cache | prefix_cache | not_computed
    pieces: dict[str, int]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    mm_inputs: list[MediaInputUsage] | None = None  # only when the prompt had images / videos


def make_usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    mm_inputs: list[MediaInputUsage] | None = None,
) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        mm_inputs=mm_inputs or None,
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
