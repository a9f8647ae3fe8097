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
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from mmserve.entrypoints.openai.http.limits import LimitExceeded, RequestLimits
from mmserve.multimodal.process_pools import stop_process_pool

logger = logging.getLogger(__name__)

GUARD_BYTES = 256 << 10  # bodies above this are screened in the helper process
GUARD_CONTAINERS = 4096  # ... and so are smaller ones with more "{" / "[" than this
HELPER_NICE = 10
HELPER_MEMORY_BYTES = 4 << 30  # address-space cap of the helper: a parse bomb fails alone
DEFAULT_MAX_WAITING = 256  # large bodies queued for the helper before more get 503


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
    """UTF-8 bytes of a string, or of the strings in a list (a list of prompts)."""
    if type(text) is list:
        return sum(_text_bytes(t) for t in text if type(t) is str)
    return len(text.encode("utf-8", "replace")) if type(text) is str else 0


def _check_counts(data: dict[str, Any], limits: RequestLimits) -> None:
    """The per-request counts, on the raw structure (wrong types are left to validation)."""
    ids = [data.get("model"), data.get("cache_salt")]
    messages = data.get("messages")
    if messages is None and type(data.get("content")) is list:  # /v1/mm/encode: one message
        messages = [{"content": data["content"]}]
    if type(messages) is list:
        limits.check("max_chat_messages", len(messages), "messages")
        parts = text = 0
        for msg in messages:
            msg = msg if type(msg) is dict else {}
            content = msg.get("content")
            ids.append(msg.get("name"))
            if type(content) is list:
                parts += len(content)
                for part in content:
                    if type(part) is dict:
                        text += _text_bytes(part.get("text"))
                        ids.append(part.get("uuid"))
            else:
                text += _text_bytes(content)
        limits.check("max_content_parts", parts, "messages")
        limits.check("max_text_bytes", text, "messages")
    limits.check("max_id_length", max(map(_text_len, ids)))
    limits.check("max_text_bytes", _text_bytes(data.get("prompt")), "prompt")
    stop = data.get("stop")
    stops = [stop] if type(stop) is str else stop if type(stop) is list else []
    limits.check("max_stop_strings", len(stops), "stop")
    limits.check("max_stop_string_length", max(map(_text_len, stops), default=0), "stop")


def _text_len(value: Any) -> int:
    return len(value) if type(value) is str else 0


def parse_and_screen(body: bytes, limits: RequestLimits) -> dict[str, Any]:
    """bytes -> the body's JSON object, or ``BodyRejected`` / ``LimitExceeded``."""
    try:
        data = json.loads(body.decode("utf-8"))  # strict: json.loads(bytes) passes surrogates
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError, over-long integers
        raise BodyRejected("the request body is not valid JSON (UTF-8)") from None
    except RecursionError:
        raise BodyRejected(f"JSON nesting deeper than {limits.max_json_depth}") from None
    except MemoryError:
        raise BodyRejected("the request body is too complex to parse") from None
    if type(data) is not dict:
        raise BodyRejected("the request body must be a JSON object")
    _walk(data, limits.max_json_depth, limits.max_json_values)
    if (b"\\ud" in body or b"\\uD" in body) and _has_lone_surrogate(data):
        raise BodyRejected("the request body contains an unpaired UTF-16 surrogate escape")
    _check_counts(data, limits)
    return data


def needs_guard(body: bytes) -> bool:
    return len(body) > GUARD_BYTES or body.count(b"{") + body.count(b"[") > GUARD_CONTAINERS


def _screen(body: bytes, limits: RequestLimits) -> tuple[str, Any, Any]:
    """Helper-process side: ("ok", the parsed object, None) or ("limit" / "bad", message,
    param). The parsed object travels back pickled, so the server never runs the JSON parser
    on the body (unpickling a screened object costs about a memcpy)."""
    try:
        return "ok", parse_and_screen(body, limits), None
    except LimitExceeded as exc:
        return "limit", str(exc), exc.param
    except BodyRejected as exc:
        return "bad", str(exc), None


def _init_helper() -> None:
    os.nice(HELPER_NICE)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (HELPER_MEMORY_BYTES, HELPER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # not Linux, or a lower hard limit
        pass


class GuardBusy(Exception):
    """More large bodies wait for screening than the guard queues (HTTP 503)."""


class JSONGuard:
    """One lazily started helper process that parses and screens large or dense bodies.

    Invariants: the server's own process never runs the JSON parser on such a body (it gets
    the screened object back); at most ``max_waiting`` bodies wait for the helper, more are
    refused with ``GuardBusy``; a crashed helper is replaced on the next body, and the bodies
    it held are refused; after ``shutdown`` nothing is started again.
    """

    def __init__(self, limits: RequestLimits, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        """``max_waiting``: the server passes ``--max-queued-requests``, so a burst of large
        bodies (images as data URLs) is bounded by the same limit as any other burst."""
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.limits = limits
        self.max_waiting = max_waiting
        self._pool: ProcessPoolExecutor | None = None
        self._waiting = 0
        self._closed = False

    def start(self) -> None:
        if self._pool is None and not self._closed:
            self._pool = ProcessPoolExecutor(
                1, mp_context=get_context("spawn"), initializer=_init_helper
            )

    async def warm_up(self) -> None:
        """Spawn the helper now, by screening an empty object in it: a spawned process imports
        the server's main module, which takes seconds the first large body would wait. A
        failure is only logged: a broken helper is replaced on the next body anyway."""
        try:
            await self.parse(b"{}")
        except Exception as exc:
            logger.warning("JSON guard warm-up failed: %s", exc)

    async def parse(self, body: bytes) -> dict[str, Any]:
        """The screened JSON object, or ``LimitExceeded`` / ``BodyRejected`` / ``GuardBusy``."""
        if self._waiting >= self.max_waiting:
            raise GuardBusy("too many large request bodies are waiting; retry later")
        self.start()
        pool = self._pool
        if pool is None:
            raise GuardBusy("the server is shutting down")
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            kind, value, param = await loop.run_in_executor(pool, _screen, body, self.limits)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise BodyRejected("the request body could not be screened; retry") from None
        finally:
            self._waiting -= 1
        if kind == "limit":
            raise LimitExceeded(value, param)
        if kind == "bad":
            raise BodyRejected(value)
        return value

    def shutdown(self) -> None:
        """Stop the helper; returns once it has ended (``stop_process_pool``): call it off
        the event loop."""
        self._closed = True
        if self._pool is not None:
            stop_process_pool(self._pool)
            self._pool = None
