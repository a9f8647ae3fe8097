"""Screening JSON request bodies: syntax, nesting depth, value count, lone surrogates, and the
counts ``RequestLimits`` bounds, checked on the raw structure before any pydantic validation.

Parsing and walking a hostile body (a 2 MB message of 64k parts, 300k stop strings) holds the
GIL for hundreds of milliseconds, which would stall the engine thread and every stream. Large or
dense bodies are therefore screened in a helper process (``JSONGuard``): the server parses only
bodies whose structure is known to be bounded by the limits. Standard library only, so the
spawned helper starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from mmserve.entrypoints.openai.limits import LimitExceeded, RequestLimits

GUARD_BYTES = 256 << 10  # bodies above this are screened in the helper process
GUARD_CONTAINERS = 4096  # ... and so are smaller ones with more "{" / "[" than this
HELPER_NICE = 10


class BodyRejected(ValueError):
    """The body is not acceptable JSON (HTTP 400); ``str(exc)`` is the client message."""


def _walk(data: Any, max_depth: int, max_values: int) -> None:
    """Depth and value count in one iterative pass (no recursion, no per-node allocation
    beyond the stack)."""
    stack, values = [(data, 1)], 1
    while stack:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node
        values += len(children)
        if values > max_values:
            raise LimitExceeded(
                f"more than {max_values} JSON values in the body (--max-json-values)"
            )
        for child in children:
            if type(child) is dict or type(child) is list:
                if depth >= max_depth:
                    raise BodyRejected(f"JSON nesting deeper than {max_depth} (--max-json-depth)")
                stack.append((child, depth + 1))


def _has_lone_surrogate(data: Any) -> bool:
    stack = [data]
    while stack:
        node = stack.pop()
        if type(node) is str:
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif type(node) is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    return False


def _text_bytes(text: Any) -> int:
    return len(text.encode("utf-8", "replace")) if type(text) is str else 0


def _check_counts(data: dict[str, Any], limits: RequestLimits) -> None:
    """The per-request counts, on the raw structure (wrong types are left to validation)."""
    messages = data.get("messages")
    if type(messages) is list:
        limits.check("max_chat_messages", len(messages), "messages")
        parts = text = 0
        for msg in messages:
            content = msg.get("content") if type(msg) is dict else None
            if type(content) is list:
                parts += len(content)
                text += sum(_text_bytes(p.get("text")) for p in content if type(p) is dict)
            else:
                text += _text_bytes(content)
        limits.check("max_content_parts", parts, "messages")
        limits.check("max_text_bytes", text, "messages")
    limits.check("max_text_bytes", _text_bytes(data.get("prompt")), "prompt")
    stop = data.get("stop")
    stops = [stop] if type(stop) is str else stop if type(stop) is list else []
    limits.check("max_stop_strings", len(stops), "stop")
    limits.check("max_stop_string_length", max(map(_text_len, stops), default=0), "stop")
    limits.check("max_cache_salt_length", _text_len(data.get("cache_salt")), "cache_salt")


def _text_len(value: Any) -> int:
    return len(value) if type(value) is str else 0


def parse_and_screen(body: bytes, limits: RequestLimits) -> dict[str, Any]:
    """bytes -> the body's JSON object, or ``BodyRejected`` / ``LimitExceeded``."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BodyRejected("the request body is not valid JSON") from None
    except RecursionError:
        raise BodyRejected(f"JSON nesting deeper than {limits.max_json_depth}") from None
    if type(data) is not dict:
        raise BodyRejected("the request body must be a JSON object")
    _walk(data, limits.max_json_depth, limits.max_json_values)
    if (b"\\ud" in body or b"\\uD" in body) and _has_lone_surrogate(data):
        raise BodyRejected("the request body contains an unpaired UTF-16 surrogate escape")
    _check_counts(data, limits)
    return data


def needs_guard(body: bytes) -> bool:
    return len(body) > GUARD_BYTES or body.count(b"{") + body.count(b"[") > GUARD_CONTAINERS


def _screen(body: bytes, limits: RequestLimits) -> tuple[str, str | None, str | None] | None:
    """Helper-process side: None if acceptable, else (message, param, code)."""
    try:
        parse_and_screen(body, limits)
    except LimitExceeded as exc:
        return str(exc), exc.param, exc.code
    except BodyRejected as exc:
        return str(exc), None, None
    return None


class JSONGuard:
    """One lazily started helper process that screens large or dense bodies.

    Invariants: the server's own process only parses bodies the guard accepted (or small,
    sparse ones), so no body makes it hold the GIL for long; a crashed helper is replaced on
    the next body, and that body is refused rather than parsed in-process.
    """

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1, mp_context=get_context("spawn"), initializer=os.nice, initargs=(HELPER_NICE,)
            )

    async def screen(self, body: bytes) -> None:
        """Raise ``LimitExceeded`` / ``BodyRejected`` for a body the server must not parse."""
        self.start()
        assert self._pool is not None
        loop = asyncio.get_running_loop()
        try:
            verdict = await loop.run_in_executor(self._pool, _screen, body, self.limits)
        except BrokenProcessPool:
            self._pool = None
            raise BodyRejected("the request body could not be screened; retry") from None
        if verdict is not None:
            message, param, code = verdict
            raise LimitExceeded(message, param) if code else BodyRejected(message)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
