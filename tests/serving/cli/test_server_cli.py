"""``mmserve serve``: help text, flag -> engine-argument mapping, and a real subprocess server
(defaults: no API key, no local files) that answers 503 when overloaded and stops on SIGINT."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from mmserve.cli import build_parser
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine_args import EngineArgs, parse_bytes
from mmserve.entrypoints.listen_port import free_port
from mmserve.entrypoints.openai.cli_args import engine_args
from mmserve.entrypoints.openai.serve_policies import media_policy
from tests.support.server import wait_until_healthy

CLI = [sys.executable, "-m", "mmserve.cli"]
FLAGS = [
    "--model",
    "--host",
    "--port",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--block-size",
    "--num-kv-blocks",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--limit-mm-per-prompt",
    "--disable-chunked-mm-input",
    "--encoder-cache-size",
    "--encoder-cache-memory",
    "--max-num-encoder-input-tokens",
    "--max-model-len",
    "--served-model-name",
    "--api-key",
    "--dtype",
    "--seed",
    "--allowed-local-media-path",
    "--max-queued-requests",
    "--allowed-media-domains",
    "--allowed-media-networks",
    "--media-fetch-timeout",
    "--max-concurrent-media-fetches",
    "--max-video-bytes",
    "--public-metrics",
    "--enable-mm-embeds",
    "--allowed-hosts",
    "--allowed-origins",
    "--shutdown-timeout",
    "--text-workers",
    "--media-workers",
    "--max-request-body-bytes",
    "--max-json-depth",
    "--max-chat-messages",
    "--max-content-parts",
    "--max-text-bytes",
    "--max-stop-strings",
    "--max-stop-string-length",
    "--max-id-length",
]


def test_serve_help_lists_flags() -> None:
    out = subprocess.run(
        [*CLI, "serve", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for flag in FLAGS:
        assert flag in out, flag
    assert "tiny-llava" in out  # the default model


def test_flags_map_to_engine_arguments(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--max-num-batched-tokens",
            "512",
            "--max-num-seqs",
            "3",
            "--block-size",
            "8",
            "--num-kv-blocks",
            "99",
            "--no-enable-prefix-caching",
            "--limit-mm-per-prompt",
            '{"image": 3}',
            "--disable-chunked-mm-input",
            "--encoder-cache-size",
            "1024",
            "--encoder-cache-memory",
            "64MiB",
            "--max-num-encoder-input-tokens",
            "512",
            "--max-model-len",
            "1024",
            "--dtype",
            "bfloat16",
            "--seed",
            "7",
            "--allowed-local-media-path",
            str(tmp_path),
            "--allowed-media-domains",
            "Images.Example.com.",
            "--allowed-media-networks",
            "10.1.0.0/16",
            "--media-fetch-timeout",
            "7",
            "--max-concurrent-media-fetches",
            "3",
        ]
    )
    policy = media_policy(args)
    assert policy.allowed_local_path == tmp_path.resolve()
    assert policy.allowed_domains == frozenset({"images.example.com"})
    assert [str(n) for n in policy.allowed_networks] == ["10.1.0.0/16"]
    assert (policy.total_timeout_s, policy.max_concurrent_fetches) == (7, 3)
    assert engine_args(args) == EngineArgs(
        dtype="bfloat16",
        seed=7,
        max_model_len=1024,
        block_size=8,
        num_kv_blocks=99,
        enable_prefix_caching=False,
        encoder_cache_memory=64 << 20,
        max_num_batched_tokens=512,
        max_num_seqs=3,
        disable_chunked_mm_input=True,
        encoder_cache_size=1024,
        max_num_encoder_input_tokens=512,
        limit_mm_per_prompt={"image": 3},
    )
    default_policy = media_policy(build_parser().parse_args(["serve"]))
    assert default_policy.allowed_local_path is None  # no local files unless asked
    assert default_policy.allowed_networks == () and default_policy.allowed_domains is None
    assert args.model == "tiny-llava" and args.host == "127.0.0.1" and args.port == 8000
    assert parse_bytes("1GiB") == 1 << 30 and parse_bytes("1048576") == 1 << 20


@pytest.mark.parametrize(
    "argv",
    [
        ["--limit-mm-per-prompt", "{image: 2}"],
        ["--limit-mm-per-prompt", '{"image": -1}'],
        ["--encoder-cache-memory", "lots"],
        ["--dtype", "int3"],
        ["--port", "x"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", *argv])
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--allowed-media-networks", "10.0.0.1/8"], "10.0.0.1/8"),
        (["--allowed-media-networks", "intranet"], "intranet"),
        (["--media-fetch-timeout", "0"], "0"),
        (["--max-concurrent-media-fetches", "0"], "0"),
    ],
)
def test_bad_media_flags_name_the_value(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        media_policy(build_parser().parse_args(["serve", *argv]))


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_every_engine_setting_has_one_default(command: str) -> None:
    """CLI flags are generated from EngineArgs: every field parses to the Python default."""
    args = build_parser().parse_args([command])
    assert engine_args(args) == EngineArgs()
    for f in dataclasses.fields(EngineArgs):
        flag = "--" + f.name.replace("_", "-")
        assert flag in build_parser()._subparsers._group_actions[0].choices[command].format_help()


@pytest.mark.parametrize("workload", ["latency", "multiturn", "probe", "reuse"])
def test_bench_engine_flags_come_from_engine_args(workload: str) -> None:
    import importlib

    from mmserve.bench.cli import workload_module

    parser = importlib.import_module(workload_module(workload)).build_parser()
    assert EngineArgs.from_cli_args(parser.parse_args([])) == EngineArgs(model="tiny-llava-small")
    args = parser.parse_args(["--max-num-seqs", "3", "--no-enable-prefix-caching"])
    assert EngineArgs.from_cli_args(args).as_kwargs()["max_num_seqs"] == 3
    assert EngineArgs.from_cli_args(args).enable_prefix_caching is False


def test_engine_arguments_reach_the_engine_and_unknown_ones_fail() -> None:
    engine = LLMEngine.from_args(
        "tiny-llava", block_size=8, max_num_seqs=3, kv_cache_memory=1 << 26
    )
    cache, sched = engine.config.cache, engine.config.scheduler
    assert (cache.block_size, sched.max_num_seqs, cache.kv_cache_memory) == (8, 3, 1 << 26)
    assert (
        engine.config.cache
        == EngineArgs(block_size=8, max_num_seqs=3, kv_cache_memory=1 << 26).cache_config()
    )
    with pytest.raises(ValueError, match="max_num_seq"):
        LLMEngine.from_args("tiny-llava", max_num_seq=3)


def test_bad_limit_flags_name_the_value() -> None:
    from mmserve.entrypoints.openai.http.limits import limits_from_args

    with pytest.raises(ValueError, match="max_content_parts"):
        limits_from_args(build_parser().parse_args(["serve", "--max-content-parts", "0"]))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "server.log").open("w+")
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--port",
            str(port),
            "--max-num-seqs",
            "1",
            "--max-queued-requests",
            "1",
            "--uvicorn-log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            code = None
        log.seek(0)
        output = log.read()
        log.close()
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def _poll(url: str, name: str, value: float, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while _metric(url, name) != value:
        assert time.monotonic() < deadline, f"{name} never became {value}"
        time.sleep(0.02)


def test_defaults_no_key_and_no_local_files(served: str, tmp_path: Path) -> None:
    assert httpx.get(f"{served}/v1/models").json()["data"][0]["id"] == "tiny-llava"
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    content = [{"type": "image_url", "image_url": {"url": str(tmp_path / "x.png")}}]
    body = {"model": "tiny-llava", "messages": [{"role": "user", "content": content}]}
    resp = httpx.post(f"{served}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == f"could not fetch image from {tmp_path / 'x.png'}"


def test_overload_returns_503_then_recovers(served: str) -> None:
    body = {
        "model": "tiny-llava",
        "prompt": "Once upon a time",
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    url = f"{served}/v1/completions"
    b_status: list[int] = []

    def second_request() -> None:  # waits behind the first (max-num-seqs 1)
        with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as resp:
            b_status.append(resp.status_code)
            next(resp.iter_lines())

    with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep a reference: a collected iterator closes the socket
        next(lines)  # running now
        waiter = threading.Thread(target=second_request)
        waiter.start()
        _poll(served, "mmserve_num_requests_waiting", 1)
        resp = httpx.post(url, json={**body, "stream": False, "max_tokens": 4}, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "overloaded"
        assert resp.headers["retry-after"] == "1"
    waiter.join(timeout=30)  # the first stream closed: the second runs, reads, disconnects
    assert b_status == [200]
    _poll(served, "mmserve_kv_blocks_used", 0)
    _poll(served, "mmserve_num_requests_running", 0)
    ok = httpx.post(url, json={**body, "stream": False, "max_tokens": 4}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--text-workers", "0"], "--text-workers"),
        (["--media-workers", "-1"], "--media-workers"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
        (["--max-queued-requests", "-1"], "--max-queued-requests"),
    ],
)
def test_bad_server_flags_name_the_flag_before_loading(argv: list[str], named: str) -> None:
    from mmserve.entrypoints.openai.cli_args import check_server_flags

    with pytest.raises(ValueError, match=named):
        check_server_flags(build_parser().parse_args(["serve", *argv]))
    check_server_flags(build_parser().parse_args(["serve"]))  # the defaults are valid


def test_empty_cache_salt_is_a_400() -> None:
    from pydantic import ValidationError

    from mmserve.entrypoints.openai.completions.protocol import CompletionRequest

    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "hi", "cache_salt": ""})
