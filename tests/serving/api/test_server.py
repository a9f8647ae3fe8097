"""End-to-end tests of the OpenAI-compatible server: a real uvicorn server on 127.0.0.1 (in a
background thread of this process) and the official ``openai`` client; greedy outputs must equal
the offline ``LLM`` on the same input."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from mmserve import LLM, SamplingParams
from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread

API_KEY = "test-key"
MODEL = "tiny-llava"
GREEDY = SamplingParams(temperature=0, max_tokens=16)


def png_url(seed: int, size: tuple[int, int] = (40, 30)) -> str:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_messages(urls: list[str], text: str = "What is in the picture?") -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def scrape(url: str, key: str = API_KEY) -> dict[str, float]:
    """/metrics as {sample name with sorted labels: value} (/metrics needs the API key)."""
    auth = {"Authorization": f"Bearer {key}"}
    text = httpx.get(f"{url}/metrics", headers=auth, timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def wait_idle(url: str, timeout: float = 10.0, key: str = API_KEY) -> dict[str, float]:
    """Poll /metrics until no KV block or encoder reference is held (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url, key)
        idle = (
            m["mmserve_kv_blocks_used"] == 0
            and m["mmserve_encoder_cache_references"] == 0
            and m["mmserve_num_requests_running"] == 0
            and m["mmserve_num_requests_waiting"] == 0
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media")
    Image.new("RGB", (32, 24), (200, 30, 30)).save(path / "red.png")
    return path


@pytest.fixture(scope="module")
def server(media_dir: Path) -> Iterator[RunningServer]:
    argv = [
        "serve",
        "--model",
        MODEL,
        "--port",
        "0",
        "--api-key",
        API_KEY,
        "--allowed-local-media-path",
        str(media_dir),
        "--limit-mm-per-prompt",
        '{"image": 2}',
        "--uvicorn-log-level",
        "warning",
    ]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL)


@pytest.mark.parametrize("num_images", [1, 2])
def test_chat_matches_offline_llm(client: OpenAI, llm: LLM, num_images: int) -> None:
    messages = chat_messages([png_url(10 * num_images + i) for i in range(num_images)])
    ref = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    ref_text = ref.outputs[0].text

    resp = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=16
    )
    choice = resp.choices[0]
    assert resp.object == "chat.completion" and resp.model == MODEL
    assert choice.message.role == "assistant"
    assert choice.message.content == ref_text
    assert choice.finish_reason == ref.outputs[0].finish_reason
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens

    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in with_choices][-1] == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == ref_text
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert usage_chunk.usage.completion_tokens == len(ref.outputs[0].token_ids)
    # the same prompt again: its prefix (image included) comes from the KV cache
    cached = usage_chunk.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < usage_chunk.usage.prompt_tokens


def test_completions_match_offline_llm(client: OpenAI, llm: LLM) -> None:
    prompt = "USER: Tell me a story about a red square. ASSISTANT:"
    ref = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    resp = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == ref.outputs[0].text
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.outputs[0].token_ids)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=16, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == ref.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == ref.outputs[0].finish_reason


def test_stop_strings_stream_equals_full(client: OpenAI) -> None:
    messages = chat_messages([png_url(3)])
    full = (
        client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)
        .choices[0]
        .message.content
    )
    stop = full[len(full) // 2 : len(full) // 2 + 2]  # a stop string inside the output
    cut = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=16, stop=[stop, "zzzq"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=16,
        stop=[stop, "zzzq"],
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == cut.choices[0].message.content


def test_local_file_inside_allowed_dir(client: OpenAI, media_dir: Path) -> None:
    for url in (str(media_dir / "red.png"), f"file://{media_dir / 'red.png'}"):
        resp = client.chat.completions.create(
            model=MODEL, messages=chat_messages([url]), temperature=0, max_tokens=4
        )
        assert resp.usage.completion_tokens >= 1


def test_concurrent_requests_match_offline(client: OpenAI, llm: LLM) -> None:
    convs = [chat_messages([png_url(100 + i)], f"Describe image {i}.") for i in range(4)]
    refs = [o.outputs[0].text for o in llm.chat(convs, GREEDY, use_tqdm=False)]

    def ask(messages: list[dict]) -> str:
        return (
            client.chat.completions.create(
                model=MODEL, messages=messages, temperature=0, max_tokens=16
            )
            .choices[0]
            .message.content
        )

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, convs)) == refs


def test_models_health_and_served_name(client: OpenAI, server: RunningServer) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_metrics_counters_move(client: OpenAI, server: RunningServer) -> None:
    before = scrape(server.url)
    for key in (
        "kv_blocks_total",
        "kv_blocks_used",
        "num_requests_running",
        "num_requests_waiting",
        "encoder_cache_bytes",
        "encoder_cache_capacity",
    ):
        assert f"mmserve_{key}" in before
    client.chat.completions.create(
        model=MODEL, messages=chat_messages([png_url(777)]), temperature=0, max_tokens=8
    )
    after = wait_idle(server.url)
    for name in (
        "mmserve_prompt_tokens_total",
        "mmserve_generation_tokens_total",
        "mmserve_encoder_cache_misses_total",
        "mmserve_encoder_images_encoded_total",
        "mmserve_time_to_first_token_seconds_count",
        "mmserve_e2e_request_latency_seconds_count",
    ):
        assert after[name] > before.get(name, 0), name
    assert (
        after["mmserve_inter_token_latency_seconds_count"]
        >= before.get("mmserve_inter_token_latency_seconds_count", 0) + 7
    )
    ok = "mmserve_http_requests_total{endpoint=/v1/chat/completions,status=200}"
    assert after[ok] > before.get(ok, 0)
    assert after["mmserve_kv_blocks_used"] == 0


def _long_body(stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": chat_messages([png_url(55)]),
        "max_tokens": 3000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


def test_client_disconnect_mid_stream_aborts(server: RunningServer) -> None:
    aborted = "mmserve_requests_finished_total{finish_reason=abort}"
    before = scrape(server.url).get(aborted, 0)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=_long_body(True)) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk
            assert scrape(server.url)["mmserve_kv_blocks_used"] > 0
    after = wait_idle(server.url)
    assert after["mmserve_kv_blocks_used"] == 0
    assert after["mmserve_encoder_cache_references"] == 0
    assert after[aborted] == before + 1
    assert after["mmserve_generation_tokens_total"] < before + 3000  # stopped early


def test_client_disconnect_non_streaming_aborts(server: RunningServer) -> None:
    aborted = "mmserve_requests_finished_total{finish_reason=abort}"
    before = scrape(server.url).get(aborted, 0)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/chat/completions",
            json=_long_body(False),
            headers=headers,
            timeout=httpx.Timeout(10, read=0.3),
        )
    after = wait_idle(server.url)
    assert after["mmserve_kv_blocks_used"] == 0
    assert after[aborted] == before + 1


def test_usage_reports_each_image_encoded_or_cached(server: RunningServer) -> None:
    """The documented ``usage.mm_inputs`` extension, whole and streamed; absent without images."""
    url, auth = f"{server.url}/v1/chat/completions", {"Authorization": f"Bearer {API_KEY}"}
    messages = chat_messages([png_url(501), png_url(502)], "Two pictures: compare them, please.")
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    first = httpx.post(url, json=body, headers=auth, timeout=60).json()["usage"]
    assert [(m["type"], m["index"], m["source"]) for m in first["mm_inputs"]] == [
        ("image", 0, "encoded"),
        ("image", 1, "encoded"),
    ]
    assert all(m["tokens"] > 0 and m["pieces"] == {"encoded": 1} for m in first["mm_inputs"])
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url, json=stream, headers=auth, timeout=60) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data: {")]
    usage = json.loads(lines[-1].removeprefix("data: "))["usage"]
    assert [m["source"] for m in usage["mm_inputs"]] == ["prefix_cache", "prefix_cache"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > sum(
        m["tokens"] for m in first["mm_inputs"]
    )
    text = {**body, "messages": [{"role": "user", "content": "Hello"}]}
    assert "mm_inputs" not in httpx.post(url, json=text, headers=auth, timeout=60).json()["usage"]
