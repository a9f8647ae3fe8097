"""A real ``redis-server`` (Debian's package) on a free loopback port, for store tests."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.server import free_port

REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None,
    reason="no redis-server binary (apt-get install redis-server; .ci/run installs it)",
)


class RedisProcess:
    """One redis-server without persistence, bound to 127.0.0.1; ``kill`` / ``pause``
    simulate a dead or hanging Redis."""

    def __init__(self) -> None:
        assert REDIS_SERVER is not None
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, "redis-server exited during startup"
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        self.client = client

    def pause(self) -> None:
        self.proc.send_signal(19)  # SIGSTOP: accepts connections, answers nothing

    def resume(self) -> None:
        self.proc.send_signal(18)  # SIGCONT

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(10)


def redis_process() -> Iterator[RedisProcess]:
    server = RedisProcess()
    try:
        yield server
    finally:
        server.kill()
