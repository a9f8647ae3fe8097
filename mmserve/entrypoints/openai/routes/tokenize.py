"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's request and response shapes.

``/tokenize`` takes ``prompt`` (``add_special_tokens`` defaults to true) or ``messages``
(rendered by the server's chat template with ``add_generation_prompt``,
``continue_final_message`` and ``chat_template_kwargs`` as a chat completion is, and, unless
``add_special_tokens`` is given, tokenized as its prompt is; vLLM's default is false) and
answers ``{count, max_model_len, tokens, token_strs}``. With images in ``messages`` the images are
fetched and processed under the server's media policy, so ``tokens`` carry the expanded image
placeholders: ``count`` is what the prompt costs in the context. ``/detokenize`` takes
``tokens`` and answers ``{prompt}``. Tokenization runs in the text pool, never on the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.entrypoints.chat_utils import ChatOptions, chat_to_prompt
from mmserve.entrypoints.openai.completions.protocol import ChatMessage
from mmserve.entrypoints.openai.completions.serving import OpenAIServing
from mmserve.entrypoints.openai.http.errors import APIError, error_response, to_api_error

ReadBody = Callable[[Request, Any], Awaitable[Any]]


class TokenizeRequest(BaseModel):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one (exactly one of
    ``prompt`` / ``messages``)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # None: true for prompt, as chat for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    # vLLM's fields mmserve's chat path does not take: refused by name
    chat_template: str | None = None
    tools: list[Any] | None = None


class DetokenizeRequest(BaseModel):
    """vLLM's DetokenizeRequest."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


def _check_tokenize(req: TokenizeRequest) -> None:
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of 'prompt' and 'messages'", param="prompt")
    if req.messages is None:
        return
    refused = [name for name in ("chat_template", "tools") if getattr(req, name) is not None]
    if refused:
        raise APIError(400, f"unsupported field(s): {', '.join(refused)}", param=refused[0])


def _chat_options(req: TokenizeRequest) -> ChatOptions:
    try:
        return ChatOptions(
            req.add_generation_prompt,
            req.continue_final_message,
            dict(req.chat_template_kwargs or {}),
        )
    except ValueError as exc:
        raise APIError(400, str(exc), param="continue_final_message") from None


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _decode(tokenizer: Any, tokens: list[int]) -> str:
    size = len(tokenizer)
    bad = [t for t in tokens if not 0 <= t < size]
    if bad:
        raise APIError(400, f"token ids out of range [0, {size}): {bad[:5]}", param="tokens")
    return str(tokenizer.decode(tokens))


class TokenizeHandler:
    """The two endpoints over one engine (its tokenizer, text pool and admission)."""

    def __init__(self, engine: AsyncLLMEngine, serving: OpenAIServing) -> None:
        self.engine = engine
        self.serving = serving

    async def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        self.serving.check_model(req.model)
        _check_tokenize(req)
        engine, tokenizer = self.engine, self.engine.tokenizer
        if req.messages is not None:
            messages = [m.model_dump(exclude_none=True) for m in req.messages]
            messages = await self.serving.decode_embeds(messages)
            options = _chat_options(req)
            template = engine.chat_template
            inp = await engine.run_text(
                chat_to_prompt, tokenizer, messages, None, template, options
            )
            prompt: str | list[int] = inp.prompt  # tokenized as a chat completion's prompt is
            if req.add_special_tokens is not None:
                flag = req.add_special_tokens
                prompt = await engine.run_text(_encode, tokenizer, inp.prompt, flag)
            # the engine's own admission: image placeholders expanded as a generation's are
            mm_kwargs = req.mm_processor_kwargs
            self.serving.check_mm_kwargs(mm_kwargs)
            chat = dataclasses.replace(inp, prompt=prompt, mm_processor_kwargs=mm_kwargs)
            processed = await engine.admission.admit(chat)
            tokens = list(processed.prompt_token_ids)
        else:
            special = req.add_special_tokens is not False
            tokens = await engine.run_text(_encode, tokenizer, req.prompt, special)
        strs = None
        if req.return_token_strs:
            strs = await engine.run_text(tokenizer.convert_ids_to_tokens, tokens)
        return {
            "count": len(tokens),
            "max_model_len": engine.max_model_len,
            "tokens": tokens,
            "token_strs": strs,
        }

    async def detokenize(self, req: DetokenizeRequest) -> dict[str, Any]:
        self.serving.check_model(req.model)
        return {"prompt": await self.engine.run_text(_decode, self.engine.tokenizer, req.tokens)}


def add_tokenize_routes(app: FastAPI, handler: TokenizeHandler, body: ReadBody) -> None:
    """``POST /tokenize`` and ``POST /detokenize``; every failure is an OpenAI-shaped error."""

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> Any:
        try:
            return await handler.tokenize(await body(raw, TokenizeRequest))
        except Exception as exc:
            return error_response(to_api_error(exc))

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> Any:
        try:
            return await handler.detokenize(await body(raw, DetokenizeRequest))
        except Exception as exc:
            return error_response(to_api_error(exc))
