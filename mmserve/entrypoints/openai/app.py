"""The FastAPI app: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.

Request bodies are parsed here rather than by FastAPI so that the API key is checked first and
every malformed body (bad JSON, not an object, failed validation) is an OpenAI-shaped 400.
``/health`` and ``/metrics`` need no API key (like vLLM); everything under ``/v1`` does when
one is configured.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmserve.engine.async_engine import AsyncLLMEngine
from mmserve.engine.metrics import ServerMetrics
from mmserve.entrypoints.openai.errors import (
    APIError,
    error_response,
    install_error_handlers,
    to_api_error,
    validation_error,
)
from mmserve.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from mmserve.entrypoints.openai.serving import OpenAIServing

MAX_BODY_BYTES = 64 << 20  # a request body above this is refused with 413
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
M = TypeVar("M", bound=BaseModel)


class HTTPMetricsMiddleware:
    """Counts responses by endpoint and status code (pure ASGI: streaming is untouched)."""

    def __init__(self, app: ASGIApp, stats: ServerMetrics) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            self.stats.observe_http(path if path in ENDPOINTS else "other", status)


async def read_body(raw: Request, model: type[M]) -> M:
    """Parse and validate a JSON object body; every failure is an APIError (400 / 413)."""
    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(list(exc.errors(include_url=False))) from None


def build_app(
    engine: AsyncLLMEngine,
    *,
    served_model_names: list[str],
    model_aliases: set[str] | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The app around a (not yet started) engine; its lifespan starts and stops the loop."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="mmserve", lifespan=lifespan)
    app.state.engine = engine
    serving = OpenAIServing(engine, served_model_names, model_aliases)
    app.state.serving = serving
    install_error_handlers(app)
    app.add_middleware(HTTPMetricsMiddleware, stats=engine.stats)

    async def check_api_key(raw: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = raw.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and secrets.compare_digest(
            token.strip().encode(), api_key.encode()
        )
        if not ok:
            raise APIError(401, "Incorrect or missing API key.", code="invalid_api_key")

    @app.get("/health")
    async def health() -> Response:
        try:
            engine.check_health()
        except Exception as exc:
            err = to_api_error(exc)
            return JSONResponse({"status": "unavailable", "detail": err.message}, err.status)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.stats.render(), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        root = str(engine.engine.config.model.path)
        cards = [
            ModelCard(id=name, root=root, max_model_len=engine.max_model_len)
            for name in served_model_names
        ]
        return ModelList(data=cards).model_dump()

    @v1.post("/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        try:
            return await serving.chat(raw, await read_body(raw, ChatCompletionRequest))
        except Exception as exc:  # answered here: the catch-all handler drops the connection
            return error_response(to_api_error(exc))

    @v1.post("/completions")
    async def completions(raw: Request) -> Response:
        try:
            return await serving.completion(raw, await read_body(raw, CompletionRequest))
        except Exception as exc:
            return error_response(to_api_error(exc))

    app.include_router(v1)
    return app
