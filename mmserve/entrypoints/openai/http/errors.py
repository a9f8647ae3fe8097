"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Status mapping: ValueError / pydantic validation -> 400 (``MediaHandleError``: with its
``code``), ``MediaTooLargeError`` (an image or a
video over a limit) -> 413, bad or
missing API key -> 401, unknown model -> 404, overload / shutdown -> 503, engine failure and
anything unexpected -> 500 with a generic message (the traceback goes to the log only).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from PIL import Image
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mmserve.engine.errors import (
    EngineOverloadedError,
    EngineShutdownError,
    EngineStepError,
)
from mmserve.entrypoints.openai.http.json_guard import GuardBusy
from mmserve.entrypoints.openai.http.limits import LimitExceeded
from mmserve.multimodal.handles import MediaHandleError
from mmserve.multimodal.media.limits import MediaTooLargeError, VideoTooLargeError


class ClientGone(Exception):
    """The client disconnected before its request was read or answered (not a server error)."""


logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    499: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error answered with ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.err_type = err_type or _TYPES.get(status, "invalid_request_error")


RETRY_AFTER_S = 1  # what a 503 (overload, shutdown) asks clients to wait
_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>|\b0x[0-9a-fA-F]{6,}\b")


def scrub(message: str) -> str:
    """A client-facing message without object reprs or heap addresses (defence in depth: the
    messages raised on purpose carry none)."""
    return _REPR.sub("<object>", message)


def error_body(
    message: str, err_type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    return {"error": {"message": scrub(message), "type": err_type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    headers: dict[str, str] = {}
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if err.status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    body = error_body(err.message, err.err_type, err.param, err.code)
    return JSONResponse(body, status_code=err.status, headers=headers or None)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _loc(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "content", "list[...]", 1)`` -> ``messages[0].content[1]``
    (pydantic's union-branch labels are dropped)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "body" or part in _TYPE_TAGS or "[" in part or part[:1].isupper():
            continue
        elif not text.endswith(f".{part}") and text != part:  # a union tag repeats the field
            text += f".{part}" if text else part
    return text


def validation_error(errors: list[Any]) -> APIError:
    """A 400 APIError summarising pydantic / FastAPI validation errors, most specific first."""
    errors = sorted(errors, key=lambda e: -len(e.get("loc", ())))
    deepest = len(errors[0].get("loc", ())) if errors else 0
    msgs: list[str] = []
    param = None
    for err in errors:
        if len(err.get("loc", ())) < deepest and msgs:
            break  # shallower errors are other union branches failing on the same value
        loc = _loc(tuple(err.get("loc", ())))
        param = param or loc or None
        msg = f"{loc}: {err.get('msg', 'invalid value')}" if loc else err.get("msg", "")
        if msg not in msgs:
            msgs.append(msg)
    return APIError(400, "; ".join(msgs[:4]) or "invalid request", param=param)


def _is_too_large(exc: BaseException) -> bool:
    """MediaTooLargeError, or a ValueError raised while handling PIL's DecompressionBombError
    (``image.decode`` re-raises that one as a plain ValueError ``from None``; ``__context__``
    keeps it)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (MediaTooLargeError, Image.DecompressionBombError)):
            return True
        exc, seen = exc.__context__, seen + 1  # type: ignore[assignment]
    return False


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception raised while serving a request to the APIError to answer with."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ClientGone):
        return APIError(499, "client disconnected", code="client_disconnected")
    if isinstance(exc, LimitExceeded):
        return APIError(400, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, GuardBusy):
        return APIError(503, str(exc), code="overloaded")
    if isinstance(exc, ValueError) and _is_too_large(exc):
        code = "video_too_large" if isinstance(exc, VideoTooLargeError) else "image_too_large"
        return APIError(413, str(exc), code=code)
    if isinstance(exc, MediaHandleError):
        return APIError(400, str(exc), param="messages", code=exc.code)
    if isinstance(exc, ValidationError):
        return validation_error(exc.errors(include_url=False))
    if isinstance(exc, ValueError):
        return APIError(400, str(exc) or type(exc).__name__)
    if isinstance(exc, EngineOverloadedError):
        return APIError(503, str(exc), code="overloaded")
    if isinstance(exc, EngineShutdownError):
        return APIError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, EngineStepError):
        logger.warning("a request failed in the engine: %s", exc)
        return APIError(
            500,
            "the engine failed while running this request (see the server log)",
            code="engine_error",
        )
    logger.error("unhandled error while serving a request", exc_info=exc)
    return APIError(500, "internal server error", code="internal_error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error path of the app through ``to_api_error``."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(exc.status_code, str(exc.detail))
        return error_response(err)

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(to_api_error(exc))

    @app.exception_handler(Exception)  # last resort (Starlette logs it and closes the connection)
    async def _any(_: Request, exc: Exception) -> JSONResponse:
        return error_response(to_api_error(exc))
