"""Reading a JSON request body: media type, size, disconnects, then ``json_guard``'s screening.

Every malformed body is a 400 (415 for another media type, 413 for size) with an OpenAI error
body; a client that hangs up mid-body is ``ClientGone`` (not a server error). Large or dense
bodies are parsed and screened in the guard's helper process and validated in the text pool;
small sparse ones (at most 256 KiB and 4096 containers: a few ms) are handled inline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from mmserve.entrypoints.openai.http.errors import APIError, ClientGone, validation_error
from mmserve.entrypoints.openai.http.json_guard import JSONGuard, needs_guard, parse_and_screen
from mmserve.entrypoints.openai.http.limits import RequestLimits

M = TypeVar("M", bound=BaseModel)
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
    too_large = APIError(413, f"request body exceeds {max_bytes} bytes (--max-request-body-bytes)")
    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in raw.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def validate(data: dict[str, Any], model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(list(exc.errors(include_url=False))) from None


def parse_json_body(body: bytes, model: type[M], limits: RequestLimits) -> M:
    """bytes -> validated model; every failure is a 400."""
    return validate(parse_and_screen(body, limits), model)


async def read_json_body(
    raw: Request, model: type[M], limits: RequestLimits, guard: JSONGuard, offload: Offload
) -> M:
    """Check the media type, read (size-capped), screen and parse."""
    check_media_type(raw)
    body = await read_raw_body(raw, limits.max_request_body_bytes)
    if needs_guard(body):
        data = await guard.parse(body)
        return await offload(validate, data, model)
    return parse_json_body(body, model, limits)
