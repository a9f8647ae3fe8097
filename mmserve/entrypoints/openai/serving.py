"""Request handling of /v1/chat/completions and /v1/completions.

- Sampling fields are validated before any image is loaded; fields a request leaves unset take
  the generation config's defaults; ``max_tokens`` defaults to the room left in the context
  (capped by the generation config's ``max_new_tokens``) once the prompt is processed, and an
  explicit ``max_tokens`` that does not fit the context is a 400 (as with OpenAI / vLLM).
- Non-streaming requests and the wait for a stream's first output race against the client's
  ``http.disconnect``: a client that goes away aborts its request. Open streams are cancelled by
  Starlette on disconnect, which aborts through ``AsyncLLMEngine.generate``'s cleanup.
- A stream starts only after the first output, so input errors still get a proper status code;
  later failures are reported in-band as an error event followed by ``data: [DONE]``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from mmserve.engine.async_engine import AsyncLLMEngine
from mmserve.engine.chat_template import ChatTemplate
from mmserve.engine.generation_defaults import (
    build_sampling_params,
    default_max_tokens,
    merge_defaults,
)
from mmserve.engine.outputs import RequestOutput
from mmserve.entrypoints.chat_utils import ChatOptions, chat_to_prompt
from mmserve.entrypoints.openai.errors import APIError, error_body, to_api_error
from mmserve.entrypoints.openai.logprobs_format import (
    LogprobsFormatter,
    format_prompt_logprobs,
)
from mmserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Usage,
    make_usage,
)
from mmserve.entrypoints.openai.request_fields import (
    REFUSED_CHAT,
    REFUSED_COMPLETION,
    unsupported_fields,
)
from mmserve.entrypoints.openai.streaming import (
    DeltaTracker,
    aclose_quietly,
    last_item,
    sse,
    until_disconnect,
)
from mmserve.entrypoints.openai.structured_fields import structured_spec
from mmserve.entrypoints.openai.tool_calls import ToolMode
from mmserve.inputs import PromptInput
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


def usage_of(out: RequestOutput) -> Usage:
    """The prompt counted once, the completion tokens of every choice."""
    completion = sum(len(c.token_ids) for c in out.outputs)
    return make_usage(len(out.prompt_token_ids), completion, out.num_cached_tokens)


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


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys (strings)."""
    out = {}
    for key, value in (bias or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
    return out


def _stops(req: AnyRequest) -> list[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


class OpenAIServing:
    """Validation, generation and response shaping for one served model."""

    def __init__(
        self,
        engine: AsyncLLMEngine,
        served_model_names: list[str],
        model_aliases: set[str] | None = None,
    ) -> None:
        self.engine = engine
        self.model_name = served_model_names[0]
        self.accepted_names = set(served_model_names) | (model_aliases or set())

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
        factory = self.sampling_factory(req, constraint)
        options = chat_options(req)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        template = self.engine.chat_template
        inp = await self.engine.run_text(
            _render, self.engine.tokenizer, messages, template, options
        )
        await self._compile(constraint)
        rid = uuid.uuid4().hex
        gen = self.engine.generate(
            inp.prompt,
            inp.images,
            inp.uuids,
            factory,
            rid,
            req.cache_salt,
            req.mm_processor_kwargs,
        )
        return await self._respond(raw, req, gen, "chat", f"chatcmpl-{rid}", tools)

    async def completion(self, raw: Request, req: CompletionRequest) -> Any:
        """/v1/completions: one text or token-id prompt (no images) -> JSON or SSE."""
        self.engine.check_health()
        self.check_model(req.model)
        constraint = structured_spec(req)
        factory = self.sampling_factory(req, constraint)
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
        gen = self.engine.generate(prompt, (), None, factory, rid, req.cache_salt)
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

    async def _compile(self, constraint: tuple[str, StructuredOutputsParams] | None) -> None:
        """Compile the output constraint in the text pool (cached by content); 400 if bad."""
        if constraint is None:
            return
        name, spec = constraint
        try:
            await self.engine.run_text(self.engine.engine.grammar.compile, spec)
        except ValueError as exc:
            raise APIError(400, f"{name}: {exc}", param=name) from None

    def sampling_factory(
        self,
        req: AnyRequest,
        constraint: tuple[str, StructuredOutputsParams] | None = None,
    ) -> Callable[[int], SamplingParams]:
        """Validate the sampling fields now; size max_tokens once the prompt length is known."""
        max_seqs = self.engine.engine.config.scheduler.max_num_seqs
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
        defaults = self.engine.generation_defaults
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
                    "stop": _stops(req),
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
            base.check_token_ids(self.engine.engine.vocab_size)
        except ValueError as exc:  # messages start with the field name ("top_p must be ...")
            field = str(exc).split(" ", 1)[0]
            if field == "logprobs" and isinstance(req, ChatCompletionRequest):
                field = "top_logprobs"
            raise APIError(400, str(exc), param=field if field in _SAMPLING else None) from None
        max_len = self.engine.max_model_len

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
                return JSONResponse(self._full_response(kind, rid, final, tools))
            first = await until_disconnect(raw, anext(gen))
        except BaseException:
            await aclose_quietly(gen)
            raise
        return StreamingResponse(
            self._stream(kind, rid, req, gen, first, tools), media_type="text/event-stream"
        )

    def _full_response(
        self, kind: str, rid: str, out: RequestOutput, tools: ToolMode | None = None
    ) -> dict[str, Any]:
        choices = []
        for comp in out.outputs:
            choice: dict[str, Any] = {
                "index": comp.index,
                "finish_reason": comp.finish_reason,
                "logprobs": None,
            }
            if comp.logprobs is not None:
                fmt = LogprobsFormatter(self.engine.tokenizer, kind)
                choice["logprobs"] = fmt.format(comp.logprobs, 0)
            if kind == "chat":
                choice["message"] = {"role": "assistant", "content": comp.text}
                if tools is not None and tools.parses:
                    content, calls = tools.parse(comp.text)
                    choice["message"] = {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": calls,
                    }
                    choice["finish_reason"] = tools.finish_reason(comp.finish_reason, bool(calls))
            else:
                choice["text"] = comp.text
            choices.append(choice)
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage_of(out).model_dump(),
        }
        if out.prompt_logprobs is not None:  # vLLM: on the body (chat), on each choice (text)
            prompt_lps = format_prompt_logprobs(self.engine.tokenizer, out.prompt_logprobs)
            if kind == "chat":
                body["prompt_logprobs"] = prompt_lps
            else:
                for choice in choices:
                    choice["prompt_logprobs"] = prompt_lps
        return body

    async def _stream(
        self,
        kind: str,
        rid: str,
        req: AnyRequest,
        gen: AsyncIterator[RequestOutput],
        first: RequestOutput,
        tools: ToolMode | None = None,
    ) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {
            "id": rid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }

        def chunk(choices: list[dict[str, Any]], usage: Usage | None = None) -> str:
            body: dict[str, Any] = {**head, "choices": choices}
            if include_usage:  # OpenAI sends "usage": null on every chunk but the last
                body["usage"] = usage.model_dump() if usage is not None else None
            return sse(body)

        n = len(first.outputs)
        parsing = tools is not None and tools.parses
        streamers = [tools.streamer() if tools is not None and parsing else None for _ in range(n)]
        streamed = [""] * n

        def choice(
            index: int, text: str, finish: str | None, role: bool = False, logprobs: Any = None
        ) -> dict[str, Any]:
            if kind != "chat":
                return {"index": index, "finish_reason": finish, "logprobs": logprobs, "text": text}
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            streamer = streamers[index]
            if streamer is not None and not role:
                delta.update(streamer.feed(streamed[index], finish is not None))
                if finish is not None and tools is not None:
                    finish = tools.finish_reason(finish, streamer.called)
            elif text or role:
                delta["content"] = text
            return {"index": index, "finish_reason": finish, "logprobs": logprobs, "delta": delta}

        fmts = [LogprobsFormatter(self.engine.tokenizer, kind) for _ in range(n)]
        trackers = [DeltaTracker(_stops(req)) for _ in range(n)]
        ended = [False] * n
        try:
            if kind == "chat":  # one role chunk per choice, as vLLM sends
                for i in range(n):
                    yield chunk([choice(i, "", None, role=True)])
            out: RequestOutput | None = first
            while out is not None:
                for i, comp in enumerate(out.outputs):
                    if ended[i]:
                        continue
                    done = out.finished or comp.finish_reason is not None
                    text = trackers[i].delta(comp.text, done)
                    streamed[i] += text
                    if text or done:
                        finish = comp.finish_reason if done else None
                        logprobs = fmts[i].next_delta(comp.logprobs)
                        yield chunk([choice(i, text, finish, logprobs=logprobs)])
                        ended[i] = done
                if out.finished:
                    if include_usage:
                        yield chunk([], usage_of(out))
                    break
                out = await anext(gen, None)
        except Exception as exc:  # headers are out: report in-band, then end the stream
            err = to_api_error(exc)
            yield sse(error_body(err.message, err.err_type, err.param, err.code))
        finally:
            await aclose_quietly(gen)
        yield sse("[DONE]")
