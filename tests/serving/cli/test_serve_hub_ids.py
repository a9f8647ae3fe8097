"""``mmserve serve ORG/NAME``: downloads from a fake hub on 127.0.0.1 and serves under the ID;
``HF_HUB_OFFLINE=1`` serves from the pre-filled cache; a missing, gated or unreachable model is
one line and exit code 2, before torch is imported."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mmserve.cli import build_parser
from mmserve.entrypoints.listen_port import free_port
from mmserve.entrypoints.openai.cli_args import validate_serve_flags
from mmserve.entrypoints.openai.server import serve_in_thread
from mmserve.models.tiny import resolve_model_path
from tests.support.fake_hub import FakeHub, checkpoint_files, dead_endpoint, hub_env, use_hub
from tests.support.server import wait_until_healthy

SERVE = ["serve", "org/tiny", "--max-num-seqs", "1", "--media-workers", "0", "--skip-server-warmup"]
SERVE += ["--uvicorn-log-level", "warning"]
CHAT = {"model": "org/tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    files = checkpoint_files(resolve_model_path("tiny-llava"))
    with FakeHub() as fake:
        fake.add("org/tiny", files)
        fake.add("org/gated", files, gated=True)
        yield fake


def _check_served(url: str) -> None:
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["root"]) for m in models] == [("org/tiny", "org/tiny")]
    reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "org/tiny"
    assert reply.json()["usage"]["completion_tokens"] >= 1


def test_downloads_from_the_hub_then_serves_offline_from_the_cache(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "hf"
    use_hub(monkeypatch, hub.url, home)
    args = build_parser().parse_args([*SERVE, "--port", "0"])
    validate_serve_flags(args)  # what `mmserve serve` runs first: the download
    assert hub.files_requested("GET") and args.model_path.startswith(str(home / "hub"))
    with serve_in_thread(args) as server:
        _check_served(server.url)

    seen = len(hub.requests)
    port = free_port()
    env = hub_env(dead_endpoint(), home, offline=True)
    log = (tmp_path / "server.log").open("w+")
    cmd = [sys.executable, "-m", "mmserve.cli", *SERVE, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout=180)
        _check_served(url)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
        log.seek(0)
        output = log.read()
        log.close()
    assert code == 0 and "Traceback" not in output, output[-3000:]
    assert len(hub.requests) == seen


@pytest.mark.parametrize(
    ("argv", "offline", "expected"),
    [
        (["org/missing"], False, "error: model 'org/missing': no such repository on "),
        (["org/gated"], False, "error: model 'org/gated' is gated on "),
        (["org/tiny", "--revision", "nope"], False, "error: model 'org/tiny': revision 'nope'"),
        (["org/tiny"], True, "error: model 'org/tiny': revision 'main' is not (completely) in"),
        (["org/tiny"], None, "error: model 'org/tiny': cannot reach http://127.0.0.1:"),
    ],
    ids=["missing", "gated", "revision", "offline-empty-cache", "unreachable"],
)
def test_a_model_that_cannot_be_had_is_one_line_and_exit_code_2(
    hub: FakeHub, tmp_path: Path, argv: list[str], offline: bool | None, expected: str
) -> None:
    """``offline`` None: the endpoint is a closed port."""
    endpoint = dead_endpoint() if offline is None else hub.url
    code = (
        "import sys; from mmserve.cli import main; "
        f"rc = main(['serve', *{argv!r}]); print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=hub_env(endpoint, tmp_path / "hf", offline=bool(offline)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["2", "False"], out
    assert out.stderr.startswith(expected) and out.stderr.count("\n") == 1, out.stderr
