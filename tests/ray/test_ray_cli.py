"""``mmserve serve --replicas 2`` as a real subprocess: one port, the OpenAI API, a clean stop.

Skipped when Ray is not installed (``pip install mmserve[ray]``); CI installs the extra.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mmserve.entrypoints.listen_port import free_port
from tests.support.server import image_messages, wait_until_healthy

pytest.importorskip("ray.serve", reason="Ray Serve tests need the mmserve[ray] extra")


def test_serve_replicas_serves_the_api_on_one_port_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["serve", "tiny-llava", "--replicas", "2", "--port", str(port), "--media-workers", "0"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmserve.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            wait_until_healthy(proc, url, timeout=240)
        except AssertionError as exc:  # why it exited, for the CI log
            tail = log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{exc}; its output ends:\n{tail}") from None
        body = {"model": "tiny-llava", "messages": image_messages(3), "max_tokens": 4}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        cluster = httpx.get(f"{url}/cluster", timeout=60).json()
        assert len(cluster["replicas"]) == 2
        assert cluster["total"]["encoder_images_encoded"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
