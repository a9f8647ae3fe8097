"""A server you can expose: request limits, HTTP hygiene, API key coverage, tenancy (cache_salt,
uuid scoping), a loop that never blocks, per-request cancellation. Real uvicorn servers on
127.0.0.1; a local bait HTTP server records every connection it accepts."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mmserve.cli import build_parser
from mmserve.entrypoints.listen_port import free_port
from mmserve.entrypoints.openai.completions import serving
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread
from tests.serving.api.test_server import png_url, scrape, wait_idle

API_KEY = "hardening-key"
MODEL = "tiny-llava"
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def start(*extra: str) -> Any:
    argv = ["serve", "--model", MODEL, "--port", "0", "--uvicorn-log-level", "error", *extra]
    return serve_in_thread(build_parser().parse_args(argv))


@pytest.fixture(scope="module")
def server(bait) -> Iterator[RunningServer]:
    with start(
        "--api-key",
        API_KEY,
        "--allowed-hosts",
        "127.0.0.1",
        "localhost",
        "--limit-mm-per-prompt",
        '{"image": 2}',
        "--max-content-parts",
        "64",
        "--max-chat-messages",
        "16",
        "--max-text-bytes",
        "20000",
        "--max-stop-strings",
        "8",
        "--max-stop-string-length",
        "32",
        "--max-json-depth",
        "16",
        "--max-request-body-bytes",
        "2000000",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
        yield client


def text_chat(**extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return {**body, **extra}


def parts_chat(n: int, text: str = "x") -> dict[str, Any]:
    parts = [{"type": "text", "text": text}] * n
    return text_chat(messages=[{"role": "user", "content": parts}])


def image_chat(*urls: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "What is this?"})
    return text_chat(messages=[{"role": "user", "content": parts}], **extra)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text)
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "0x" not in err["message"] and "Traceback" not in resp.text
    return err


LIMIT_CASES = [
    ("content parts", parts_chat(65), "--max-content-parts"),
    (
        "messages",
        text_chat(messages=[{"role": "user", "content": "a"}] * 17),
        "--max-chat-messages",
    ),
    (
        "text bytes",
        text_chat(messages=[{"role": "user", "content": "é" * 10001}]),
        "--max-text-bytes",
    ),
    ("stop count", text_chat(stop=[f"s{i}" for i in range(9)]), "--max-stop-strings"),
    ("stop length", text_chat(stop=["x" * 33]), "--max-stop-string-length"),
    ("cache_salt length", text_chat(cache_salt="s" * 257), "--max-id-length"),
    ("model name length", text_chat(model="m" * 300), "--max-id-length"),
    ("list prompt text", {"model": MODEL, "prompt": ["x" * 30_000]}, "--max-text-bytes"),
    ("json depth", text_chat(extra_field=nested(20)), "--max-json-depth"),
    ("json values", text_chat(extra_field=[0] * 300_000), "--max-json-values"),
    ("many parts, large body", parts_chat(40_000), "--max-content-parts"),
]


@pytest.mark.parametrize(("name", "body", "flag"), LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_limits_are_400s_naming_the_flag(
    http: httpx.Client, name: str, body: dict[str, Any], flag: str
) -> None:
    err = error_of(http.post(CHAT, json=body), 400)
    assert flag in err["message"], (name, err)


def test_images_over_the_limit_are_refused_before_any_fetch(http: httpx.Client, bait) -> None:
    urls = [f"{bait.url}/a.png", f"{bait.url}/b.png", f"{bait.url}/c.png"]
    err = error_of(http.post(CHAT, json=image_chat(*urls)), 400)
    assert "limit" in err["message"]
    assert bait.connections == 0


def test_malformed_bodies(http: httpx.Client) -> None:
    json_type = {"Content-Type": "application/json"}
    very_deep = b'{"model": "tiny-llava", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error_of(http.post(CHAT, content=very_deep, headers={"Content-Type": "application/json"}), 400)
    surrogate = json.dumps(text_chat()).replace('"hi"', '"hi \\ud800"').encode()
    err = error_of(
        http.post(CHAT, content=surrogate, headers={"Content-Type": "application/json"}), 400
    )
    assert "surrogate" in err["message"]
    error_of(
        http.post(CHAT, content=b"\xff\xfe{}", headers={"Content-Type": "application/json"}), 400
    )
    raw_surrogate = json.dumps(text_chat()).replace('"hi"', '"hi @"').encode()
    raw_surrogate = raw_surrogate.replace(b"@", b"\xed\xa0\x80")  # UTF-8-encoded U+D800
    err = error_of(http.post(CHAT, content=raw_surrogate, headers=json_type), 400)
    long_int = b'{"model": "tiny-llava", "messages": [], "x": ' + b"9" * 5000 + b"}"
    error_of(http.post(CHAT, content=long_int, headers=json_type), 400)
    big = json.dumps(text_chat(pad="x" * 2_100_000)).encode()
    error_of(http.post(CHAT, content=big, headers={"Content-Type": "application/json"}), 413)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_non_json_posts_are_415(server: RunningServer, content_type: str | None) -> None:
    headers = dict(AUTH)
    if content_type is not None:
        headers["Content-Type"] = content_type
    resp = httpx.post(f"{server.url}{CHAT}", content=json.dumps(text_chat()), headers=headers)
    error_of(resp, 415)


def test_api_key_covers_metrics_and_docs(server: RunningServer) -> None:
    for path in ("/metrics", "/docs", "/openapi.json", "/redoc", "/v1/models"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path
        assert httpx.get(f"{server.url}{path}", headers=AUTH).status_code == 200, path
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_public_metrics_opt_in() -> None:
    with start("--api-key", API_KEY, "--public-metrics") as srv:
        assert httpx.get(f"{srv.url}/metrics").status_code == 200
        assert httpx.get(f"{srv.url}/openapi.json").status_code == 401


def test_host_header_allow_list(server: RunningServer) -> None:
    resp = httpx.get(f"{server.url}/health", headers={"Host": "attacker.example"})
    err = error_of(resp, 400)
    assert "Host" in err["message"]
    ok = httpx.get(f"{server.url}/health", headers={"Host": f"localhost:{server.port}"})
    assert ok.status_code == 200


def test_no_cors_headers_unless_origins_are_allowed(server: RunningServer) -> None:
    headers = {**AUTH, "Origin": "https://evil.example"}
    resp = httpx.get(f"{server.url}/v1/models", headers=headers)
    assert "access-control-allow-origin" not in resp.headers
    preflight = {
        "Origin": "https://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    resp = httpx.options(f"{server.url}{CHAT}", headers=preflight)
    assert "access-control-allow-origin" not in resp.headers
    with start("--allowed-origins", "https://app.example") as srv:
        ok = httpx.options(
            f"{srv.url}{CHAT}", headers={**preflight, "Origin": "https://app.example"}
        )
        assert ok.headers.get("access-control-allow-origin") == "https://app.example"
        bad = httpx.options(f"{srv.url}{CHAT}", headers=preflight)
        assert "access-control-allow-origin" not in bad.headers


def test_models_show_the_served_name_not_a_path(http: httpx.Client) -> None:
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == card["root"] == MODEL
    assert "/" not in json.dumps(card)


def test_errors_carry_no_reprs(http: httpx.Client) -> None:
    import base64

    junk = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    err = error_of(http.post(CHAT, json=image_chat(junk)), 400)
    assert "BytesIO" not in err["message"] and "object at" not in err["message"]


def _status_count(url: str, status: int) -> float:
    return sum(
        v
        for k, v in scrape(url, API_KEY).items()
        if k.startswith("mmserve_http_requests_total") and f"status={status}" in k
    )


def test_client_hanging_up_mid_body_is_no_server_error(server: RunningServer) -> None:
    before = _status_count(server.url, 500)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": "tiny')
        time.sleep(0.2)
    time.sleep(0.3)
    assert _status_count(server.url, 500) == before
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_overload_answer_has_retry_after() -> None:
    from mmserve.entrypoints.openai.http.errors import APIError, error_response

    resp = error_response(APIError(503, "busy"))
    assert resp.headers["retry-after"] == "1"
    assert build_parser().parse_args(["serve"]).max_queued_requests > 0  # bounded by default


# ---- media fetching through the server ---------------------------------------------------------
def test_internal_urls_refused_with_one_message(http: httpx.Client, bait) -> None:
    closed_port = free_port()  # nothing listens there
    urls = [
        f"{bait.url}/image.png",
        f"http://localhost:{bait.port}/image.png",
        f"http://[::ffff:127.0.0.1]:{bait.port}/image.png",
        f"http://0.0.0.0:{bait.port}/image.png",
        f"http://127.0.0.1:{closed_port}/image.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        f"HTTP://127.0.0.1:{bait.port}/image.png",  # any letter case takes the same path
        f"http://127.0.0.1:{bait.port}/" + "a" * 10_000,
    ]
    messages = set()
    for url in urls:
        err = error_of(http.post(CHAT, json=image_chat(url)), 400)
        shown = url if len(url) <= 120 else url[:117] + "..."
        messages.add(err["message"].replace(shown, "<url>"))
    assert messages == {"could not fetch image from <url>"}
    assert bait.connections == 0


@pytest.fixture(scope="module")
def fetching_server(bait) -> Iterator[RunningServer]:
    with start(
        "--allowed-media-networks",
        "127.0.0.1/32",
        "--max-concurrent-media-fetches",
        "2",
        "--media-fetch-timeout",
        "15",
    ) as srv:
        yield srv


def test_private_networks_opt_in(fetching_server: RunningServer, bait) -> None:
    url = f"{fetching_server.url}{CHAT}"
    ok = httpx.post(url, json=image_chat(f"{bait.url}/image.png"), timeout=30)
    assert ok.status_code == 200, ok.text
    metadata = image_chat("http://169.254.169.254/latest/meta-data/")
    error_of(httpx.post(url, json=metadata, timeout=30), 400)


def test_redirect_out_of_the_allowed_domains_is_refused(bait) -> None:
    with start(
        "--allowed-media-networks", "127.0.0.1/32", "--allowed-media-domains", "images.test"
    ) as srv:

        async def resolve(host: str, port: int) -> list[str]:
            assert host == "images.test"
            return ["127.0.0.1"]

        srv.engine.fetcher.resolver = resolve
        before = bait.connections
        target = f"http://images.test:{bait.port}/image.png"
        ok = httpx.post(f"{srv.url}{CHAT}", json=image_chat(target), timeout=30)
        assert ok.status_code == 200, ok.text  # connected to the checked address
        assert bait.hosts[-1] == f"images.test:{bait.port}"
        hop = f"http://images.test:{bait.port}/redirect?to={bait.url}/image.png"
        error_of(httpx.post(f"{srv.url}{CHAT}", json=image_chat(hop), timeout=30), 400)
        assert bait.connections == before + 2  # the image, the redirect; never its target


def test_drip_urls_do_not_starve_others_and_disconnects_cancel_fetches(
    fetching_server: RunningServer, bait
) -> None:
    url = f"{fetching_server.url}{CHAT}"
    abandoned = bait.drips_abandoned

    def drip_client() -> None:
        try:
            httpx.post(url, json=image_chat(f"{bait.url}/drip"), timeout=2.0)
        except httpx.TimeoutException:
            pass  # the client gives up and disconnects

    threads = [threading.Thread(target=drip_client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    resp = httpx.post(url, json=text_chat(), timeout=30)
    assert resp.status_code == 200
    assert time.monotonic() - t0 < 5  # text-only work never waits for image fetches (15 s)
    for t in threads:
        t.join()
    deadline = time.monotonic() + 5  # far below the 15 s fetch timeout
    while bait.drips_abandoned < abandoned + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bait.drips_abandoned >= abandoned + 2  # both fetch slots were released
    t0 = time.monotonic()
    ok = httpx.post(url, json=image_chat(f"{bait.url}/image.png"), timeout=30)
    assert ok.status_code == 200 and time.monotonic() - t0 < 5


# ---- the event loop ----------------------------------------------------------------------------
def test_chat_template_runs_off_the_event_loop(
    http: httpx.Client, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = serving._render

    def slow_render(*args: Any) -> Any:
        time.sleep(1.5)
        return real(*args)

    monkeypatch.setattr(serving, "_render", slow_render)
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(http.post(CHAT, json=text_chat()).status_code)
    )
    worker.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert time.monotonic() - t0 < 1.0  # the template sleeps 1.5 s
    worker.join()
    assert result == [200]


# ---- tenancy -----------------------------------------------------------------------------------
def _chat(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = http.post(CHAT, json={**body, "temperature": 0, "max_tokens": 6})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _cached(reply: dict[str, Any]) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_salt_isolates_prefix_and_encoder_caches(
    http: httpx.Client, server: RunningServer
) -> None:
    body = image_chat(png_url(4242))
    misses = "mmserve_encoder_cache_misses_total"
    m0 = wait_idle(server.url, key=API_KEY)[misses]
    assert _cached(_chat(http, {**body, "cache_salt": "tenant-a"})) == 0
    assert _cached(_chat(http, {**body, "cache_salt": "tenant-a"})) > 0  # own hits count
    m1 = wait_idle(server.url, key=API_KEY)[misses]
    assert m1 == m0 + 1
    assert _cached(_chat(http, {**body, "cache_salt": "tenant-b"})) == 0
    assert _cached(_chat(http, body)) == 0  # unsalted requests do not see salted entries
    assert (
        wait_idle(server.url, key=API_KEY)[misses] == m1 + 2
    )  # each tenant encoded the image itself


def test_uuid_is_scoped_by_salt_and_checked_against_size(
    http: httpx.Client, server: RunningServer
) -> None:
    def with_uuid(url: str, uid: str | None, salt: str | None = None) -> dict[str, Any]:
        body = image_chat(url)
        if uid is not None:
            body["messages"][0]["content"][0]["uuid"] = uid
        if salt is not None:
            body["cache_salt"] = salt
        return body

    def encoded(body: dict[str, Any]) -> tuple[str, float]:
        """(reply text, images encoded for it): 0 means another entry's embeddings were used."""
        before = wait_idle(server.url, key=API_KEY)["mmserve_encoder_images_encoded_total"]
        text = _chat(http, body)["choices"][0]["message"]["content"]
        return text, wait_idle(server.url, key=API_KEY)[
            "mmserve_encoder_images_encoded_total"
        ] - before

    first, other_size, same_size = png_url(1, (40, 30)), png_url(2, (64, 48)), png_url(3, (40, 30))
    assert encoded(with_uuid(first, "photo-1"))[1] == 1
    assert encoded(with_uuid(first, "photo-1"))[1] == 0  # the uuid names the same image: a hit
    truth = encoded(with_uuid(other_size, None))[0]
    assert encoded(with_uuid(other_size, "photo-1")) == (truth, 1)  # another size: a miss
    assert encoded(with_uuid(first, "photo-2", "t1"))[1] == 1
    truth = encoded(with_uuid(same_size, None, "t2"))[0]
    assert encoded(with_uuid(same_size, "photo-2", "t2")) == (truth, 1)  # another tenant: a miss


def test_hostile_large_bodies_are_never_parsed_in_the_server_process(
    http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmserve.entrypoints.openai.http import body as http_body

    parsed: list[int] = []
    real = http_body.parse_and_screen

    def spy(body: bytes, limits: Any) -> Any:
        parsed.append(len(body))
        return real(body, limits)

    monkeypatch.setattr(http_body, "parse_and_screen", spy)
    hostile = parts_chat(40_000)  # ~1.2 MB: screened (and refused) by the helper process
    err = error_of(http.post(CHAT, json=hostile), 400)
    assert "--max-content-parts" in err["message"]
    assert parsed == []
    ok = http.post(CHAT, json=text_chat(pad="x" * 300_000))  # large but acceptable
    assert ok.status_code == 200, ok.text
    assert parsed == []  # the helper parsed it; this process only validated the result


@pytest.mark.parametrize(
    ("header", "patterns", "allowed"),
    [
        ("api.example.com", ["api.example.com"], True),
        ("API.example.com:8443", ["api.example.com"], True),
        ("api.example.com", ["api.example.com:8000"], True),  # ports are ignored
        ("a.b.example.com", ["*.example.com"], True),
        ("example.com", ["*.example.com"], False),
        ("evil-example.com", ["*.example.com"], False),
        ("[::1]:8000", ["::1"], True),
        ("[::1]", ["[::1]"], True),
        ("[::1]junk", ["::1"], False),  # malformed
        ("localhost:80x", ["localhost"], False),
        ("", ["localhost"], False),
        ("anything", ["*"], True),
    ],
)
def test_host_allow_list_matching(header: str, patterns: list[str], allowed: bool) -> None:
    from mmserve.entrypoints.openai.http.middleware import host_allowed

    assert host_allowed(header, patterns) is allowed
