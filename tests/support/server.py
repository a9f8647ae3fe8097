"""Helpers for tests that run ``mmserve serve`` as a real subprocess."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
