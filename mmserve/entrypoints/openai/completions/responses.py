"""OpenAI response bodies: a whole chat / text completion, or its SSE stream (one delta per
new text, n choices tagged by index, tool calls parsed or streamed, usage last)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from mmserve.engine.outputs import RequestOutput
from mmserve.entrypoints.openai.completions.logprobs import (
    LogprobsFormatter,
    format_prompt_logprobs,
)
from mmserve.entrypoints.openai.completions.protocol import MediaInputUsage, Usage, make_usage
from mmserve.entrypoints.openai.completions.sampling import AnyRequest, stops_of
from mmserve.entrypoints.openai.completions.tool_calls import ToolMode
from mmserve.entrypoints.openai.http.errors import error_body, to_api_error
from mmserve.entrypoints.openai.http.streaming import DeltaTracker, aclose_quietly, sse


def usage_of(out: RequestOutput) -> Usage:
    """The prompt counted once, the completion tokens of every choice."""
    completion = sum(len(c.token_ids) for c in out.outputs)
    media = [MediaInputUsage.model_validate(m.as_dict()) for m in out.media_usage]
    return make_usage(len(out.prompt_token_ids), completion, out.num_cached_tokens, media)


class ResponseShaper:
    """Builds the response bodies of one served model (its name, its tokenizer for logprobs)."""

    def __init__(self, tokenizer: Any, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name

    def full(
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
                fmt = LogprobsFormatter(self.tokenizer, kind)
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
            "usage": usage_of(out).model_dump(exclude_none=True),
        }
        if out.prompt_logprobs is not None:  # vLLM: on the body (chat), on each choice (text)
            prompt_lps = format_prompt_logprobs(self.tokenizer, out.prompt_logprobs)
            if kind == "chat":
                body["prompt_logprobs"] = prompt_lps
            else:
                for choice in choices:
                    choice["prompt_logprobs"] = prompt_lps
        return body

    async def stream(
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
                body["usage"] = usage.model_dump(exclude_none=True) if usage is not None else None
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

        fmts = [LogprobsFormatter(self.tokenizer, kind) for _ in range(n)]
        trackers = [DeltaTracker(stops_of(req)) for _ in range(n)]
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
