"""Launching: the app from parsed ``serve`` flags, uvicorn in the foreground or in a thread.

Shutdown (``DrainingServer``): the first SIGTERM / SIGINT stops admission (new requests and
``/health`` answer 503 with ``Retry-After``) while in-flight requests run to completion for up
to ``--shutdown-timeout`` seconds; the rest then end with an error event and ``data: [DONE]``,
and the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from mmserve.engine.admission.pipeline import AdmissionExecutors
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.entrypoints.openai.app import build_app
from mmserve.entrypoints.openai.cli_args import check_server_flags, engine_args
from mmserve.entrypoints.openai.serve_policies import http_policy, media_policy
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.workers import MediaWorkers

logger = logging.getLogger(__name__)

CLOSE_CONNECTIONS_S = 5  # after draining: how long uvicorn waits for sockets to close
QUIET_PATHS = frozenset({"/health", "/ping", "/metrics"})  # polled: no access-log lines


class QuietPathsFilter(logging.Filter):
    """Drops uvicorn access-log records of ``QUIET_PATHS`` (probes and scrapes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in QUIET_PATHS
        return True


def _quiet_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietPathsFilter) for f in access.filters):
        access.addFilter(QuietPathsFilter())


def startup_summary(engine: LLMEngine, args: argparse.Namespace) -> str:
    """One log paragraph: what runs, how much fits, where to reach it."""
    mc, cache = engine.config.model, engine.config.cache
    blocks = engine.scheduler.kv.pool.num_blocks
    kv_tokens = blocks * cache.block_size
    url = f"http://{args.host}:{args.port}" if args.port else f"http://{args.host}, a free port"
    return (
        f"model {args.model} ({mc.path}), architecture {mc.architecture}, dtype {mc.dtype},"
        f" device {engine.device}, max_model_len {mc.max_model_len}\n"
        f"KV cache: {blocks} blocks of {cache.block_size} tokens ({kv_tokens} tokens),"
        f" max concurrency {kv_tokens / mc.max_model_len:.2f}x at {mc.max_model_len}"
        f" tokens per request, max_num_seqs {engine.config.scheduler.max_num_seqs}\n"
        f"encoder: up to {mc.max_tokens_per_image} embeddings per image, per-step budget"
        f" {engine.encoder_budget} embeddings, cache {engine.scheduler.encoder_cache.capacity}"
        f" embeddings, {engine.config.scheduler.max_images_per_prompt} images per prompt\n"
        f"serving on {url} (/v1/chat/completions, /v1/completions, /v1/mm/encode,"
        " /v1/models, /tokenize, /detokenize, /health, /ping, /version, /metrics)"
        + ("; the playground page at /" if http_policy(args).ui else "")
    )


def build_app_from_args(args: argparse.Namespace) -> FastAPI:
    """Load the model and build the app; the engine loop starts with the app's lifespan."""
    check_server_flags(args)
    settings = engine_args(args)
    for note in settings.ignored_settings():
        logger.info(note)
    policy_for_media = media_policy(args)
    policy = http_policy(args)
    llm_engine = LLMEngine.from_engine_args(settings, media_policy=policy_for_media)
    executors = AdmissionExecutors.sized_for(args.text_workers)
    processes = executors.media_workers if args.media_workers is None else args.media_workers
    engine = AsyncLLMEngine(
        llm_engine,
        max_queued_requests=args.max_queued_requests,
        start=False,
        executors=executors,
        fetcher=MediaFetcher(policy_for_media),
        media_workers=MediaWorkers(llm_engine.processor, processes) if processes else None,
    )
    names = list(args.served_model_name or [args.model])
    aliases = {args.model, str(llm_engine.config.model.path)}
    app = build_app(
        engine,
        served_model_names=names,
        model_aliases=aliases,
        policy=policy,
        model_root=args.model,
        warm_up=not args.skip_server_warmup,
    )
    logger.info(startup_summary(llm_engine, args))
    return app


def _config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_graceful_shutdown=CLOSE_CONNECTIONS_S,
        lifespan="on",
    )
    _quiet_access_log()  # after the Config: it (re)configures uvicorn's loggers
    return config


class DrainingServer(uvicorn.Server):
    """uvicorn, but a shutdown signal drains the engine before the sockets close."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLMEngine, timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread). Not recorded for re-raising: the exit code stays 0."""
        if self._draining or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self.drain())

    async def drain(self) -> None:
        logger.info(
            "shutting down: refusing new requests, in-flight ones get up to %.0f s",
            self.shutdown_timeout,
        )
        try:
            cut = await self.engine.drain(self.shutdown_timeout)
            if cut:
                logger.warning("ended %d request(s) still running at --shutdown-timeout", cut)
            await asyncio.sleep(0.1)  # let the ended streams send their error event and [DONE]
        finally:
            self.should_exit = True


def run(args: argparse.Namespace) -> int:
    """Serve in the foreground until SIGINT / SIGTERM; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = build_app_from_args(args)
    server = DrainingServer(_config(app, args), app.state.engine, args.shutdown_timeout)
    server.run()
    logger.info("server stopped")
    return 0 if server.started else 1


@dataclass
class RunningServer:
    """A server started by ``serve_in_thread``."""

    app: FastAPI
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine(self) -> AsyncLLMEngine:
        return self.app.state.engine


@contextmanager
def serve_in_thread(args: argparse.Namespace, timeout: float = 60.0) -> Iterator[RunningServer]:
    """Run the server in a background thread of this process (tests, benchmarks).

    ``--port 0`` binds a free port; the bound one is in the yielded ``RunningServer``. On exit
    the server shuts down (engine loop included) and the thread is joined (bounded).
    """
    app = build_app_from_args(args)
    server = uvicorn.Server(_config(app, args))
    thread = threading.Thread(target=server.run, name="mmserve-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log)")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield RunningServer(app, args.host, port)
    finally:
        server.should_exit = True
        thread.join(timeout=CLOSE_CONNECTIONS_S + 10)
        if thread.is_alive():
            logger.warning("the server thread did not stop in time")
