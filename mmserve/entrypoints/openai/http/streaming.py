"""Small async/SSE helpers: delta tracking, SSE framing, racing work against a disconnect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request

from mmserve.entrypoints.openai.http.errors import APIError

T = TypeVar("T")


class DeltaTracker:
    """Turns cumulative text into deltas.

    While the request runs it holds back the last ``max(len(stop)) - 1`` characters (a stop
    string may still complete and cut them) and any trailing U+FFFD (an incomplete UTF-8
    sequence), so the streamed deltas concatenate to the final non-streamed text.
    """

    def __init__(self, stops: list[str]) -> None:
        self.sent = 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def delta(self, text: str, finished: bool) -> str:
        end = len(text)
        if not finished:
            end -= self.hold
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent : end], end
        return piece


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json or literal>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(raw: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; if the client disconnects first, cancel it and raise a 499."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_wait_disconnect(raw))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise APIError(499, "client disconnected", code="client_disconnected")


async def aclose_quietly(gen: AsyncIterator[Any]) -> None:
    """Close an async generator; ignore 'already running' (a cancelled task still owns it)."""
    try:
        await gen.aclose()  # type: ignore[attr-defined]
    except RuntimeError:
        pass


async def last_item(gen: AsyncIterator[T]) -> T:
    """Exhaust ``gen`` and return its last item (RuntimeError if it yields nothing)."""
    final: T | None = None
    async for item in gen:
        final = item
    if final is None:
        raise RuntimeError("the engine returned no output")
    return final
