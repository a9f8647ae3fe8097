"""vLLM's extra endpoints and observability against a real server on 127.0.0.1: /tokenize,
/detokenize, /version, /ping, /v1/models (official client), ``vllm:`` metrics with a
``model_name`` label, the start-up summary, no access-log lines for probes and scrapes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import (
    QuietPathsFilter,
    RunningServer,
    serve_in_thread,
    startup_summary,
)
from mmserve.version import package_version
from tests.serving.api.test_server import chat_messages, png_url, scrape

NAME = "my-llava"
ARGV = ["serve", "tiny-llava", "--port", "0", "--served-model-name", NAME, "--max-model-len", "1k"]


class _Paths(logging.Handler):
    """Collects the request paths of uvicorn's access-log records."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.paths.append(str(record.args[2]))  # type: ignore[index]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread(build_parser().parse_args(ARGV)) as srv:
        yield srv


def post(server: RunningServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_models_lists_the_served_name_with_vllm_fields(server: RunningServer) -> None:
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    (card,) = client.models.list().data
    assert (card.id, card.owned_by) == (NAME, "mmserve")
    raw = httpx.get(f"{server.url}/v1/models").json()["data"][0]
    assert raw["root"] == "tiny-llava" and raw["max_model_len"] == 1000
    assert raw["parent"] is None and raw["object"] == "model"


def test_tokenize_a_prompt(server: RunningServer) -> None:
    tokenizer = server.engine.tokenizer
    text = "Once upon a time"
    got = post(server, "/tokenize", {"model": NAME, "prompt": text, "return_token_strs": True})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["tokens"] == tokenizer(text)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 1000
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    plain = post(server, "/tokenize", {"prompt": text}).json()
    assert plain["token_strs"] is None and plain["tokens"] == body["tokens"]


def test_tokenize_messages_counts_what_a_chat_costs(server: RunningServer) -> None:
    """With an image, ``count`` includes the expanded image placeholders: it equals the
    ``prompt_tokens`` a chat completion with the same messages reports."""
    messages = chat_messages([png_url(3)])
    got = post(server, "/tokenize", {"model": NAME, "messages": messages})
    assert got.status_code == 200, got.text
    tokens = got.json()["tokens"]
    chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert len(tokens) == chat["usage"]["prompt_tokens"]
    text_only = post(server, "/tokenize", {"messages": chat_messages([])}).json()
    assert len(tokens) - text_only["count"] > 100  # 576 patches for tiny-llava's 336 px input


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "exactly one"),
        ({}, "exactly one"),
        ({"messages": [{"role": "user", "content": "a"}], "chat_template": "{{x}}"},
         "chat_template"),
        ({"messages": [{"role": "user", "content": "a"}], "tools": []}, "tools"),
        ({"messages": [{"role": "user", "content": "a"}], "continue_final_message": True},
         "continue_final_message"),
        ({"prompt": "a", "model": "gpt-4"}, "gpt-4"),
    ],
)  # fmt: skip
def test_tokenize_refusals_name_the_field(server: RunningServer, body: dict, named: str) -> None:
    got = post(server, "/tokenize", body)
    assert got.status_code in (400, 404), got.text
    assert named in got.json()["error"]["message"]


def test_tokenize_messages_takes_the_chat_options(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with_prompt = post(server, "/tokenize", {"messages": messages}).json()["count"]
    body = {"messages": messages, "add_generation_prompt": False}
    without = post(server, "/tokenize", body).json()["count"]
    assert 0 < without < with_prompt  # the assistant turn's opening is not rendered


def test_detokenize_round_trips(server: RunningServer) -> None:
    body = {"prompt": "a red circle", "add_special_tokens": False}
    tokens = post(server, "/tokenize", body).json()["tokens"]
    got = post(server, "/detokenize", {"model": NAME, "tokens": tokens})
    assert got.status_code == 200 and got.json() == {"prompt": "a red circle"}
    bad = post(server, "/detokenize", {"tokens": [0, 10**9]})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]


def test_version_and_ping(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/version").json() == {"version": package_version()}
    assert httpx.get(f"{server.url}/ping").status_code == 200
    assert httpx.post(f"{server.url}/ping").status_code == 200


def test_metrics_carry_vllm_names_and_the_model_name(server: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True}
    assert post(server, "/v1/completions", body).status_code == 200
    assert post(server, "/v1/completions", body).status_code == 200  # a prefix-cache hit
    m = scrape(server.url)
    label = f"model_name={NAME}"
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert m[f"{gauge}{{{label}}}"] == 0
    assert 0 <= m[f"vllm:kv_cache_usage_perc{{{label}}}"] <= 1
    assert m[f"vllm:request_success_total{{finished_reason=length,{label}}}"] >= 2
    assert m[f"vllm:generation_tokens_total{{{label}}}"] >= 6
    assert m[f"vllm:prompt_tokens_total{{{label}}}"] == m["mmserve_prompt_tokens_total"]
    queries = m[f"vllm:prefix_cache_queries_total{{{label}}}"]
    assert queries == m["mmserve_prefix_cache_queries_total"] * 16  # tokens, like vLLM
    assert m[f"vllm:time_to_first_token_seconds_count{{{label}}}"] >= 2
    assert m[f"vllm:inter_token_latency_seconds_count{{{label}}}"] >= 4
    assert m[f"vllm:e2e_request_latency_seconds_count{{{label}}}"] >= 2
    assert "mmserve_encoder_cache_hits_total" in m  # mmserve's own metrics stay beside them


def test_probes_and_scrapes_leave_no_access_log_lines(server: RunningServer) -> None:
    access_log = _Paths()  # added now: uvicorn's logging set-up drops earlier handlers
    logging.getLogger("uvicorn.access").addHandler(access_log)
    try:
        for path in ("/health", "/ping", "/metrics", "/version", "/metrics?x=1"):
            httpx.get(f"{server.url}{path}")
    finally:
        logging.getLogger("uvicorn.access").removeHandler(access_log)
    assert "/version" in access_log.paths
    assert not {"/health", "/ping", "/metrics", "/metrics?x=1"} & set(access_log.paths)
    record = logging.LogRecord("uvicorn.access", 20, "", 0, "%s", ("", "GET", "/v1"), None)
    assert QuietPathsFilter().filter(record)


def test_startup_summary_says_what_runs_and_how_much_fits(server: RunningServer) -> None:
    text = startup_summary(server.engine.engine, build_parser().parse_args(ARGV))
    engine = server.engine.engine
    blocks = engine.scheduler.kv.pool.num_blocks
    for part in (
        "LlavaForConditionalGeneration",
        "dtype float32",
        "device cpu",
        f"{blocks} blocks of 16 tokens",
        "max concurrency",
        f"per-step budget {engine.encoder_budget} embeddings",
        "serving on http://127.0.0.1, a free port",
        "playground page at /",
    ):
        assert part in text, part
    remote = build_parser().parse_args([*ARGV, "--host", "0.0.0.0"])
    assert "playground" not in startup_summary(engine, remote)
