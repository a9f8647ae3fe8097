"""The FastAPI app: /v1/chat/completions, /v1/completions, /v1/mm/encode, /v1/models, /tokenize,
/detokenize,
/health, /ping (GET and POST, like vLLM's and SageMaker's), /version, /metrics, and with
``ui`` the playground page at ``/`` (``routes.ui``).

Request bodies are parsed by ``http.body`` rather than by FastAPI, after the middlewares have
checked the Host header and the API key, so every malformed body is an OpenAI-shaped 4xx.
With an API key, everything but ``/health`` and ``/ping`` needs it (``/metrics`` too, unless
``public_metrics``; ``/docs`` and ``/openapi.json`` too). CORS headers only for
``allowed_origins``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.entrypoints.openai.completions.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from mmserve.entrypoints.openai.completions.serving import OpenAIServing
from mmserve.entrypoints.openai.http.body import read_json_body
from mmserve.entrypoints.openai.http.errors import (
    RETRY_AFTER_S,
    error_response,
    install_error_handlers,
    to_api_error,
)
from mmserve.entrypoints.openai.http.json_guard import DEFAULT_MAX_WAITING, JSONGuard
from mmserve.entrypoints.openai.http.middleware import (
    AllowedHostsMiddleware,
    APIKeyMiddleware,
    HTTPMetricsMiddleware,
)
from mmserve.entrypoints.openai.http.policy import HTTPPolicy
from mmserve.entrypoints.openai.routes.encode import EncodeHandler, add_encode_route
from mmserve.entrypoints.openai.routes.tokenize import TokenizeHandler, add_tokenize_routes
from mmserve.entrypoints.openai.routes.ui import add_ui_routes, ui_files, ui_paths
from mmserve.version import package_version

OWNED_BY = "mmserve"  # /v1/models' owned_by (vLLM writes "vllm")


def build_app(
    engine: AsyncLLMEngine,
    *,
    served_model_names: list[str],
    model_aliases: set[str] | None = None,
    policy: HTTPPolicy | None = None,
    model_root: str | None = None,
    metrics_refresh: Callable[[], Awaitable[None]] | None = None,
    warm_up: bool = True,
) -> FastAPI:
    """The app around a (not yet started) engine; its lifespan starts and stops the loop and,
    with ``warm_up``, warms the engine, the media workers and the JSON guard's helper up before
    the server accepts connections (uvicorn binds its socket once the lifespan has started).
    ``model_root`` is /v1/models' ``root`` (the model as given; default: the first name);
    ``metrics_refresh`` is awaited before ``/metrics`` renders (the Ray ingress' replica stats)."""
    policy = policy or HTTPPolicy()
    queued = engine.max_queued_requests
    guard = JSONGuard(policy.limits, max(1, queued) if queued is not None else DEFAULT_MAX_WAITING)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start(warm_up)
        guard.start()
        if warm_up:
            await asyncio.gather(engine.warm_up(), guard.warm_up())
        try:
            yield
        finally:
            await asyncio.gather(
                asyncio.to_thread(guard.shutdown), asyncio.to_thread(engine.shutdown)
            )
            await engine.fetcher.aclose()

    app = FastAPI(title="mmserve", lifespan=lifespan)
    app.state.engine = engine
    app.state.json_guard = guard
    serving = OpenAIServing(engine, served_model_names, model_aliases, policy.mm_embeds)
    app.state.serving = serving
    engine.stats.set_model_name(served_model_names[0])
    install_error_handlers(app)
    page = ui_files() if policy.ui else {}
    if page:
        add_ui_routes(app, page)
    if policy.api_key is not None:
        public = {"/health", "/ping"} | ({"/metrics"} if policy.public_metrics else set())
        public |= ui_paths(page) if page else set()
        app.add_middleware(APIKeyMiddleware, api_key=policy.api_key, public_paths=frozenset(public))
    if policy.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(policy.allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    if policy.allowed_hosts:
        app.add_middleware(AllowedHostsMiddleware, allowed_hosts=list(policy.allowed_hosts))
    app.add_middleware(HTTPMetricsMiddleware, stats=engine.stats)

    async def body(raw: Request, model: Any) -> Any:
        return await read_json_body(raw, model, policy.limits, guard, engine.run_text)

    @app.get("/health")
    async def health() -> Response:
        try:
            engine.check_health()
        except Exception as exc:
            err = to_api_error(exc)
            headers = {"Retry-After": str(RETRY_AFTER_S)} if err.status == 503 else None
            body = {"status": "unavailable", "detail": err.message}
            return JSONResponse(body, err.status, headers=headers)
        return JSONResponse({"status": "ok"})

    @app.get("/ping")
    async def ping() -> Response:
        return await health()

    @app.post("/ping")
    async def ping_post() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": package_version()}

    @app.get("/metrics")
    async def metrics() -> Response:
        if metrics_refresh is not None:
            await metrics_refresh()
        return Response(engine.stats.render(), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1")

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        root = model_root or served_model_names[0]
        cards = [
            ModelCard(id=name, root=root, owned_by=OWNED_BY, max_model_len=engine.max_model_len)
            for name in served_model_names
        ]
        listing = ModelList(data=cards).model_dump()
        for card in listing["data"]:
            card.setdefault("parent", None)  # vLLM's field: no adapters here
        return listing

    @v1.post("/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        try:
            return await serving.chat(raw, await body(raw, ChatCompletionRequest))
        except Exception as exc:  # answered here: the catch-all handler drops the connection
            return error_response(to_api_error(exc))

    @v1.post("/completions")
    async def completions(raw: Request) -> Response:
        try:
            return await serving.completion(raw, await body(raw, CompletionRequest))
        except Exception as exc:
            return error_response(to_api_error(exc))

    app.include_router(v1)
    add_encode_route(app, EncodeHandler(engine, serving), body)
    add_tokenize_routes(app, TokenizeHandler(engine, serving), body)
    return app
