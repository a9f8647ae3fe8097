"""Launching: the app from parsed ``serve`` flags, uvicorn in the foreground or in a thread."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from mmserve.engine.async_engine import AsyncLLMEngine
from mmserve.engine.llm_engine import LLMEngine
from mmserve.entrypoints.openai.app import build_app
from mmserve.entrypoints.openai.cli_args import engine_kwargs

logger = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # open streams get this long before uvicorn closes them


def build_app_from_args(args: argparse.Namespace) -> FastAPI:
    """Load the model and build the app; the engine loop starts with the app's lifespan."""
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        raise ValueError("--max-queued-requests must be >= 0")
    kwargs = engine_kwargs(args)
    media = kwargs["allowed_local_path"]
    if media is not None and not media.is_dir():
        raise ValueError(f"--allowed-local-media-path {str(media)!r} is not a directory")
    llm_engine = LLMEngine.from_args(args.model, **kwargs)
    engine = AsyncLLMEngine(llm_engine, max_queued_requests=args.max_queued_requests, start=False)
    names = list(args.served_model_name or [args.model])
    aliases = {args.model, str(llm_engine.config.model.path)}
    return build_app(engine, served_model_names=names, model_aliases=aliases, api_key=args.api_key)


def _config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="on",
    )


def run(args: argparse.Namespace) -> int:
    """Serve in the foreground until SIGINT / SIGTERM; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = build_app_from_args(args)
    server = uvicorn.Server(_config(app, args))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises SIGINT after its graceful shutdown
        pass
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
        thread.join(timeout=GRACEFUL_SHUTDOWN_S + 10)
        if thread.is_alive():
            logger.warning("the server thread did not stop in time")
