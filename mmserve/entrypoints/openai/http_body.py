"""Reading a JSON request body: media type, size, disconnects, nesting depth, lone surrogates.

Every malformed body is a 400 (415 for another media type, 413 for size) with an OpenAI error
body; a client that hangs up mid-body is ``ClientGone`` (not a server error). Bodies above
``OFFLOAD_BYTES`` are parsed and validated in the text pool, never on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from mmserve.entrypoints.openai.errors import APIError, ClientGone, validation_error
from mmserve.entrypoints.openai.limits import RequestLimits

M = TypeVar("M", bound=BaseModel)
OFFLOAD_BYTES = 64 << 10
Offload = Callable[..., Awaitable[Any]]


def check_media_type(raw: Request) -> None:
    media_type = raw.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise APIError(
            415,
            "request bodies must be JSON sent with 'Content-Type: application/json'",
            code="unsupported_media_type",
        )


async def read_raw_body(raw: Request, max_bytes: int) -> bytes:
    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"request body exceeds {max_bytes} bytes (--max-request-body-bytes)")
    chunks, size = [], 0
    try:
        async for chunk in raw.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(
                    413, f"request body exceeds {max_bytes} bytes (--max-request-body-bytes)"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """True if arrays/objects nest deeper than ``max_depth`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def parse_json_body(body: bytes, model: type[M], max_depth: int) -> M:
    """bytes -> validated model; every failure is a 400 APIError."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise APIError(400, f"JSON nesting deeper than {max_depth} levels") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    brackets = body.count(b"[") + body.count(b"{")
    if brackets > max_depth and json_depth_exceeds(data, max_depth):
        raise APIError(400, f"JSON nesting deeper than {max_depth} levels (--max-json-depth)")
    if (b"\\ud" in body or b"\\uD" in body) and _has_lone_surrogate(data):
        raise APIError(400, "the request body contains an unpaired UTF-16 surrogate escape")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(list(exc.errors(include_url=False))) from None


async def read_json_body(
    raw: Request, model: type[M], limits: RequestLimits, offload: Offload
) -> M:
    """Check the media type, read (size-capped) and parse; large bodies parse off the loop."""
    check_media_type(raw)
    body = await read_raw_body(raw, limits.max_request_body_bytes)
    if len(body) > OFFLOAD_BYTES:
        return await offload(parse_json_body, body, model, limits.max_json_depth)
    return parse_json_body(body, model, limits.max_json_depth)
