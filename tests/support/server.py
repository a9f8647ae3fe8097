"""Talking to a server under test: a free loopback port, waiting for ``/health``, the official
``openai`` client, and a chat turn with an image. The servers themselves are fixtures
(``serve_model`` in ``tests/conftest.py``) or subprocesses the tests start."""

from __future__ import annotations

import base64
import io
import subprocess
import time
from typing import TYPE_CHECKING

import httpx
from openai import OpenAI

from tests.support.images import make_image

if TYPE_CHECKING:
    from mmserve.entrypoints.openai.server import RunningServer


def wait_until_healthy(proc: subprocess.Popen, url: str, timeout: float = 90.0) -> None:
    """Poll ``/health`` until it answers 200; fail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "server exited during startup"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)


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
