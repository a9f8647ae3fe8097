"""A real in-thread ``mmserve serve`` on 127.0.0.1 and the official client for it (the shared
pieces of the OpenAI-protocol test modules)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

from openai import OpenAI

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread
from tests.conftest import make_image


def serve_model(model: str, *extra: str) -> Iterator[RunningServer]:
    """Yield a running server for ``model`` (for a module-scoped fixture)."""
    argv = ["serve", "--model", model, "--port", "0", "--uvicorn-log-level", "warning", *extra]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        yield srv


def openai_client(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def image_messages(seed: int, size: tuple[int, int] = (40, 30)) -> list[dict]:
    """One user turn: a PNG data URL of ``make_image(seed, size)`` and a question."""
    buf = io.BytesIO()
    make_image(seed, size).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in the picture?"},
    ]
    return [{"role": "user", "content": parts}]
