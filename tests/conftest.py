"""Fixtures every test folder may use: the run's options (``--device``, the fuzz seeds), the
transformers reference and test images, a real in-thread server (``serve_model``), the bait HTTP
server and a real Redis. Plain builders of test inputs live in ``tests/support/``."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlparse

import pytest
import torch
from PIL import Image

from mmserve.entrypoints.listen_port import free_port
from tests.support.images import make_image
from tests.support.references import Reference

if TYPE_CHECKING:
    from mmserve.entrypoints.openai.server import RunningServer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-seeds", type=int, default=24, help="differential fuzz: seeds 0..N-1")
    parser.addoption("--fuzz-first-seed", type=int, default=0, help="differential fuzz: first")
    parser.addoption(
        "--device",
        default="cpu",
        help="device of the engines under test: cpu, cuda or cuda:N (every test is skipped"
        " when CUDA is asked for and absent); parity runs in float32 there too",
    )


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `-n 2` (pyproject's addopts): two workers on two cores, one torch thread each, and the
        # servers the tests start as subprocesses too, so the workers do not oversubscribe
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    device = config.getoption("device")
    os.environ["MMSERVE_DEVICE"] = device  # EngineArgs' default, also in server subprocesses
    if device != "cpu":
        os.environ["MMSERVE_DTYPE"] = "float32"  # token-identical parity is a float32 claim
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


# ---- two xdist workers (pyproject's addopts) ------------------------------------------------
# Each test module is one unit of work: its tests run on one worker, in order, and its
# module-scoped fixtures (servers, engines) are built once. The modules that start a local Ray
# cluster share one unit, so two clusters never run at once.
SHARED_UNITS = {
    "tests/ray/test_ray_serve.py": "ray-cluster",
    "tests/ray/test_ray_cli.py": "ray-cluster",
}
# The units that run longest, longest first: units go to the workers in collection order, so
# these start first and the short modules fill in around them. A serial run with `--durations`
# tells which they are; the order only moves work around, a unit missing here still runs.
SLOW_UNITS = (
    "tests/bench/test_bench_smoke.py",
    "ray-cluster",
    "tests/bench/test_encoder_store_bench.py",
    "tests/bench/test_qwen3_vl_bench.py",
    "tests/bench/test_bench_video.py",
    "tests/serving/playground/test_playground_browser.py",
    "tests/kernels/test_kernel_variants.py",
    "tests/engine/test_liveness.py",
    "tests/serving/test_server_async_engine.py",
    "tests/serving/cli/test_server_cli.py",
)


def work_unit(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return SHARED_UNITS.get(module, module)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    # xdist's own `--dist loadgroup` marks a group by rewriting item._nodeid, which pytest 9.2's
    # nodes no longer read (every test became its own unit); this scheduler maps node ids itself.
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(SLOW_UNITS)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable
    if config.getoption("device").startswith("cuda") and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="--device cuda: torch sees no CUDA device here")
        for item in items:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fuzz_seed" in metafunc.fixturenames:
        first = metafunc.config.getoption("fuzz_first_seed")
        count = metafunc.config.getoption("fuzz_seeds")
        metafunc.parametrize("fuzz_seed", range(first, first + count))


# ---- the transformers reference and test images --------------------------------------------
@pytest.fixture(scope="session")
def reference() -> Reference:
    return Reference("tiny-llava")


@pytest.fixture(scope="session")
def images() -> list[Image.Image]:
    return [make_image(i, size) for i, size in enumerate([(96, 80), (64, 64), (120, 50), (70, 90)])]


# ---- a real in-thread ``mmserve serve`` ----------------------------------------------------
@contextmanager
def _serve_model(model: str, *extra: str) -> Iterator[RunningServer]:
    from mmserve.cli import build_parser
    from mmserve.entrypoints.openai.server import serve_in_thread

    argv = ["serve", "--model", model, "--port", "0", "--uvicorn-log-level", "warning", *extra]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        yield srv


@pytest.fixture(scope="session")
def serve_model() -> Callable[..., AbstractContextManager[RunningServer]]:
    """``with serve_model(model, *flags) as server:`` runs ``mmserve serve`` for ``model`` in a
    thread of this process, on 127.0.0.1 and a port of its own, until the block ends (a test
    module's server fixture holds it for the module)."""
    return _serve_model


# ---- the bait HTTP server ------------------------------------------------------------------
def png_bytes(
    size: tuple[int, int] = (24, 20), color: tuple[int, int, int] = (10, 200, 90)
) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


class _BaitHandler(BaseHTTPRequestHandler):
    server: _BaitHTTPServer

    def setup(self) -> None:
        with self.server.lock:
            self.server.connections += 1
        super().setup()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlparse(self.path)
        self.server.hosts.append(self.headers.get("Host", ""))
        if url.path == "/image.png":
            body = png_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif url.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for _ in range(200):
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                self.server.drips_abandoned += 1
        elif url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)


class _BaitHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BaitHandler)
        self.lock = threading.Lock()
        self.connections = 0
        self.drips_abandoned = 0
        self.hosts: list[str] = []


class BaitServer:
    """A local HTTP server on 127.0.0.1 for media-fetching tests: counts every connection it
    accepts (SSRF tests assert it saw none), serves a PNG at ``/image.png``, drips bytes slowly
    at ``/drip`` (and notes when a dripping client went away), and redirects at
    ``/redirect?to=URL``. ``url`` is its base URL."""

    def __init__(self) -> None:
        self._server = _BaitHTTPServer()
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return self._server.connections

    @property
    def hosts(self) -> list[str]:
        """The Host header of every GET, in order."""
        return self._server.hosts

    @property
    def drips_abandoned(self) -> int:
        return self._server.drips_abandoned

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def bait() -> Iterator[BaitServer]:
    """The bait HTTP server, one per test module (a module's servers are told its address)."""
    server = BaitServer()
    try:
        yield server
    finally:
        server.close()


# ---- a real Redis --------------------------------------------------------------------------
REDIS_SERVER = shutil.which("redis-server")


class RedisProcess:
    """One redis-server (Debian's package) without persistence on a free loopback port;
    ``kill`` / ``pause`` simulate a dead or hanging Redis."""

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


def _redis() -> Iterator[RedisProcess]:
    if REDIS_SERVER is None:
        pytest.skip("no redis-server binary (apt-get install redis-server; .ci/run installs it)")
    server = RedisProcess()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    """A fresh Redis for each test (tests kill or pause it); skips without ``redis-server``."""
    yield from _redis()


@pytest.fixture(scope="module")
def module_redis_server() -> Iterator[RedisProcess]:
    """One Redis for a test module; skips without ``redis-server``."""
    yield from _redis()
