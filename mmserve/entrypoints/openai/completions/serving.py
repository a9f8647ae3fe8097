"""Request handling of /v1/chat/completions and /v1/completions.

- Sampling fields are validated before any image is loaded (``sampling``); bodies are
  shaped by ``responses``.
- Non-streaming requests and the wait for a stream's first output race against the client's
  ``http.disconnect``: a client that goes away aborts its request. Open streams are cancelled by
  Starlette on disconnect, which aborts through ``AsyncLLMEngine.generate``'s cleanup.
- A stream starts only after the first output, so input errors still get a proper status code;
  later failures are reported in-band as an error event followed by ``data: [DONE]``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.entrypoints.chat_utils import ChatOptions, chat_to_prompt
from mmserve.entrypoints.openai.completions.mm_embeds import (
    EmbedsDecoder,
    has_embeds,
    refuse_embeds,
)
from mmserve.entrypoints.openai.completions.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from mmserve.entrypoints.openai.completions.responses import ResponseShaper
from mmserve.entrypoints.openai.completions.sampling import AnyRequest, sampling_factory
from mmserve.entrypoints.openai.completions.structured_fields import structured_spec
from mmserve.entrypoints.openai.completions.tool_calls import ToolMode
from mmserve.entrypoints.openai.http.errors import APIError
from mmserve.entrypoints.openai.http.streaming import (
    aclose_quietly,
    last_item,
    until_disconnect,
)
from mmserve.inputs import PromptInput
from mmserve.structured_outputs import StructuredOutputsParams


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], template: ChatTemplate, options: ChatOptions
) -> PromptInput:
    """Messages -> prompt via the chat template (run in the text pool); template errors are
    400s."""
    try:
        return chat_to_prompt(tokenizer, messages, None, template, options)
    except ValueError:
        raise
    except Exception as exc:  # jinja errors raised by the template on odd conversations
        raise APIError(400, f"the chat template failed: {exc}", param="messages") from None


def chat_options(req: ChatCompletionRequest) -> ChatOptions:
    """The request's chat-template fields; bad combinations are 400s before any work."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    try:
        return ChatOptions(
            req.add_generation_prompt,
            req.continue_final_message,
            dict(req.chat_template_kwargs or {}),
            tools,
        )
    except ValueError as exc:
        param = "chat_template_kwargs" if "chat_template_kwargs" in str(exc) else None
        raise APIError(400, str(exc), param=param or "continue_final_message") from None


class OpenAIServing:
    """Validation, generation and response shaping for one served model (``mm_embeds``:
    ``--enable-mm-embeds``, ``image_embeds`` parts are accepted)."""

    def __init__(
        self,
        engine: AsyncLLMEngine,
        served_model_names: list[str],
        model_aliases: set[str] | None = None,
        mm_embeds: bool = False,
    ) -> None:
        self.engine = engine
        self.mm_embeds = mm_embeds
        self._embeds: EmbedsDecoder | None = None
        self.model_name = served_model_names[0]
        self.accepted_names = set(served_model_names) | (model_aliases or set())
        self.shaper = ResponseShaper(engine.tokenizer, self.model_name)

    # ---- endpoints -----------------------------------------------------------------------
    async def chat(self, raw: Request, req: ChatCompletionRequest) -> Any:
        """/v1/chat/completions: messages -> chat template + images -> JSON or SSE."""
        self.engine.check_health()  # draining or dead: 503 before any work
        self.check_model(req.model)
        self.check_mm_kwargs(req.mm_processor_kwargs)
        try:
            tools = ToolMode.of(req.tools, req.tool_choice, req.parallel_tool_calls)
        except ValueError as exc:
            raise APIError(400, str(exc), param="tool_choice") from None
        constraint = structured_spec(req, tools.schema())
        factory = sampling_factory(self.engine, req, constraint)
        options = chat_options(req)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        messages = await self.decode_embeds(messages)
        template = self.engine.chat_template
        inp = await self.engine.run_text(
            _render, self.engine.tokenizer, messages, template, options
        )
        await self._compile(constraint)
        rid = uuid.uuid4().hex
        prompt = dataclasses.replace(
            inp, cache_salt=req.cache_salt, mm_processor_kwargs=req.mm_processor_kwargs
        )
        gen = self.engine.generate(prompt, factory, rid)
        return await self._respond(raw, req, gen, "chat", f"chatcmpl-{rid}", tools)

    async def completion(self, raw: Request, req: CompletionRequest) -> Any:
        """/v1/completions: one text or token-id prompt (no images) -> JSON or SSE."""
        self.engine.check_health()
        self.check_model(req.model)
        constraint = structured_spec(req)
        factory = sampling_factory(self.engine, req, constraint)
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if not isinstance(prompt, str) and len(prompt) >= self.engine.max_model_len:
            raise APIError(
                400,
                f"prompt has {len(prompt)} tokens, the model's max length is"
                f" {self.engine.max_model_len} (including at least one generated token)",
                param="prompt",
            )
        await self._compile(constraint)
        rid = uuid.uuid4().hex
        gen = self.engine.generate(PromptInput(prompt, cache_salt=req.cache_salt), factory, rid)
        return await self._respond(raw, req, gen, "completion", f"cmpl-{rid}")

    # ---- validation ----------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.accepted_names:
            raise APIError(
                404,
                f"The model `{name[:64]}` does not exist (this server serves `{self.model_name}`).",
                param="model",
                code="model_not_found",
            )

    def check_mm_kwargs(self, kwargs: Any) -> None:
        """A request's ``mm_processor_kwargs``: unknown keys or bad values are 400s."""
        try:
            self.engine.engine.processor.check_mm_kwargs(kwargs)
        except ValueError as exc:
            raise APIError(400, str(exc), param="mm_processor_kwargs") from None

    async def decode_embeds(
        self, messages: list[dict[str, Any]], field: str = "messages"
    ) -> list[dict[str, Any]]:
        """``messages`` with their ``image_embeds`` parts' tensors decoded in the text pool
        (``completions.mm_embeds``); without ``mm_embeds`` such a part is a 400."""
        if not has_embeds(messages):
            return messages
        if not self.mm_embeds:
            raise refuse_embeds(field)
        if self._embeds is None:
            self._embeds = EmbedsDecoder.of(self.engine)
        return await self.engine.run_text(self._embeds.decode, messages, field)

    async def _compile(self, constraint: tuple[str, StructuredOutputsParams] | None) -> None:
        """Compile the output constraint in the text pool (cached by content); 400 if bad."""
        if constraint is None:
            return
        name, spec = constraint
        try:
            await self.engine.run_text(self.engine.engine.grammar.compile, spec)
        except ValueError as exc:
            raise APIError(400, f"{name}: {exc}", param=name) from None

    # ---- responses -----------------------------------------------------------------------
    async def _respond(
        self,
        raw: Request,
        req: AnyRequest,
        gen: AsyncIterator[RequestOutput],
        kind: str,
        rid: str,
        tools: ToolMode | None = None,
    ) -> JSONResponse | StreamingResponse:
        try:
            if not req.stream:
                final = await until_disconnect(raw, last_item(gen))
                return JSONResponse(self.shaper.full(kind, rid, final, tools))
            first = await until_disconnect(raw, anext(gen))
        except BaseException:
            await aclose_quietly(gen)
            raise
        return StreamingResponse(
            self.shaper.stream(kind, rid, req, gen, first, tools), media_type="text/event-stream"
        )
