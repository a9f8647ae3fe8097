"""Graceful shutdown of a real ``mmserve serve`` process: SIGTERM stops admission (503 with
Retry-After, /health 503), lets a short in-flight stream finish normally, ends a long one with an
error event and ``data: [DONE]`` at ``--shutdown-timeout``, and exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from mmserve.entrypoints.listen_port import free_port
from tests.support.server import wait_until_healthy

CLI = [sys.executable, "-m", "mmserve.cli"]
SHUTDOWN_TIMEOUT_S = 2.0


def _stream(url: str, max_tokens: int, events: list[str], started: threading.Event) -> None:
    body = {
        "model": "tiny-llava",
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                started.set()


def test_sigterm_drains_then_exits_zero() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile(mode="w+")
    argv = ["serve", "--port", str(port), "--uvicorn-log-level", "warning"]
    argv += ["--max-num-seqs", "2", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    proc = subprocess.Popen([*CLI, *argv], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(proc, url)
        short: list[str] = []
        long: list[str] = []
        short_started, long_started = threading.Event(), threading.Event()
        # a step takes >= 1 ms here (Python + forward): 4000 tokens outlast the timeout, 150 do not
        threads = [
            threading.Thread(target=_stream, args=(url, 4000, long, long_started)),
            threading.Thread(target=_stream, args=(url, 150, short, short_started)),
        ]
        for t in threads:
            t.start()
        assert long_started.wait(30) and short_started.wait(30)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, timeout=10)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        for t in threads:
            t.join(timeout=60)
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.seek(0)
        output = log.read()
        log.close()
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert (
        short[-1] == "[DONE]" and json.loads(short[-2])["choices"][0]["finish_reason"] == "length"
    )
    assert long[-1] == "[DONE]"
    error = json.loads(long[-2])["error"]
    assert error["code"] == "engine_unavailable", error
    assert SHUTDOWN_TIMEOUT_S - 0.5 < elapsed < SHUTDOWN_TIMEOUT_S + 10
