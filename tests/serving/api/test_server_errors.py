"""Bad input never crashes the server: each case gets the right status and an OpenAI-shaped
error body (no traceback), and the server keeps serving afterwards."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from PIL import Image

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread

pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

API_KEY = "secret-key"
MODEL = "tiny-llava"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def png_bytes(size: tuple[int, int] = (16, 16), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, "PNG")
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` (1-bit gray) with almost no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def image_chat(*urls: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "What is this?"})
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 4,
        **extra,
    }


def text_chat(**extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return {**body, **extra}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("errs")
    allowed = root / "allowed"
    allowed.mkdir()
    (allowed / "ok.png").write_bytes(png_bytes())
    (root / "outside.png").write_bytes(png_bytes())
    return {"allowed": allowed, "outside": root / "outside.png"}


@pytest.fixture(scope="module")
def server(media: dict[str, Path]) -> Iterator[RunningServer]:
    argv = [
        "serve",
        "--port",
        "0",
        "--api-key",
        API_KEY,
        "--allowed-local-media-path",
        str(media["allowed"]),
        "--limit-mm-per-prompt",
        '{"image": 2}',
        "--uvicorn-log-level",
        "error",
    ]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        yield srv


def cases(media: dict[str, Path]) -> list[tuple[str, str, Any, int]]:
    """(name, path, JSON body or raw bytes, expected status)."""
    good = data_url(png_bytes())
    allowed, outside = media["allowed"], media["outside"]
    return [
        ("invalid base64", CHAT, image_chat("data:image/png;base64,@@not-base64@@"), 400),
        ("not a data URL", CHAT, image_chat("data:image/png,rawbytes"), 400),
        ("non-image bytes", CHAT, image_chat(data_url(b"hello, this is not an image")), 400),
        ("truncated png", CHAT, image_chat(data_url(png_bytes((64, 64))[:60])), 400),
        ("empty data url", CHAT, image_chat("data:image/png;base64,"), 400),
        ("zero-width png", CHAT, image_chat(data_url(png_header(0, 10))), 400),
        ("pixel limit (10000^2)", CHAT, image_chat(data_url(png_header(10000, 10000))), 413),
        ("decompression bomb", CHAT, image_chat(data_url(png_header(20000, 20000))), 413),
        ("ftp url", CHAT, image_chat("ftp://example.com/cat.png"), 400),
        ("unreachable http", CHAT, image_chat("http://127.0.0.1:9/cat.png"), 400),
        ("local file outside", CHAT, image_chat(str(outside)), 400),
        ("path traversal", CHAT, image_chat(f"{allowed}/../{outside.name}"), 400),
        ("file url traversal", CHAT, image_chat(f"file://{allowed}/../{outside.name}"), 400),
        ("missing local file", CHAT, image_chat(str(allowed / "nope.png")), 400),
        ("too many images", CHAT, image_chat(good, good, good), 400),
        (
            "image part without url",
            CHAT,
            {
                **image_chat(),
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            400,
        ),
        (
            "unknown part type",
            CHAT,
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}],
            },
            400,
        ),
        (
            "unknown role",
            CHAT,
            {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]},
            400,
        ),
        ("n=0", CHAT, text_chat(n=0), 400),
        ("n over max_num_seqs", CHAT, text_chat(n=100_000), 400),
        ("temperature -1", CHAT, text_chat(temperature=-1), 400),
        ("top_p 0", CHAT, text_chat(top_p=0), 400),
        ("top_p 1.5", CHAT, text_chat(top_p=1.5), 400),
        ("top_k -5", CHAT, text_chat(top_k=-5), 400),
        ("max_tokens 0", CHAT, text_chat(max_tokens=0), 400),
        ("max_tokens not int", CHAT, text_chat(max_tokens="many"), 400),
        ("max_tokens over context", CHAT, text_chat(max_tokens=100_000), 400),
        (
            "prompt too long",
            CHAT,
            {**text_chat(), "messages": [{"role": "user", "content": "word " * 6000}]},
            400,
        ),
        ("stop wrong type", CHAT, text_chat(stop=5), 400),
        ("stop empty string", CHAT, text_chat(stop=[""]), 400),
        ("top_logprobs without logprobs", CHAT, text_chat(top_logprobs=2), 400),
        ("response_format tag", CHAT, text_chat(response_format={"type": "structural_tag"}), 400),
        ("json_schema missing", CHAT, text_chat(response_format={"type": "json_schema"}), 400),
        ("unknown model", CHAT, text_chat(model="gpt-17"), 404),
        ("messages empty", CHAT, text_chat(messages=[]), 400),
        ("messages not a list", CHAT, text_chat(messages="hello"), 400),
        ("missing messages", CHAT, {"model": MODEL}, 400),
        ("invalid json", CHAT, b'{"model": "tiny-llava", "messages": [', 400),
        ("body not an object", CHAT, b"[1, 2, 3]", 400),
        (
            "completion placeholder mismatch",
            COMPLETIONS,
            {"model": MODEL, "prompt": "USER: <image>\nhi ASSISTANT:"},
            400,
        ),
        ("completion empty token list", COMPLETIONS, {"model": MODEL, "prompt": []}, 400),
        ("completion two prompts", COMPLETIONS, {"model": MODEL, "prompt": ["a", "b"]}, 400),
        (
            "completion token id out of range",
            COMPLETIONS,
            {"model": MODEL, "prompt": [1, 10**9]},
            400,
        ),
        ("completion echo", COMPLETIONS, {"model": MODEL, "prompt": "hi", "echo": True}, 400),
        ("completion missing prompt", COMPLETIONS, {"model": MODEL}, 400),
    ]


def _assert_openai_error(resp: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert resp.status_code == status, (name, resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, name
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, name
    assert isinstance(err["message"], str) and err["message"], name
    assert "Traceback" not in resp.text, name
    return err


def test_bad_input_table(server: RunningServer, media: dict[str, Path]) -> None:
    table = cases(media)
    assert len(table) >= 20
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for name, path, body, status in table:
            if isinstance(body, bytes):
                resp = http.post(path, content=body, headers={"Content-Type": "application/json"})
            else:
                resp = http.post(path, json=body)
            _assert_openai_error(resp, status, name)
            assert http.get("/health").status_code == 200, name
        # streaming requests fail the same way, before any SSE byte is sent
        resp = http.post(CHAT, json=image_chat("ftp://x/y.png", stream=True))
        _assert_openai_error(resp, 400, "stream ftp")
        ok = http.post(CHAT, json=image_chat(data_url(png_bytes()), temperature=0))
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["role"] == "assistant"
        local = http.post(CHAT, json=image_chat(str(media["allowed"] / "ok.png")))
        assert local.status_code == 200, local.text
        assert http.get("/metrics").status_code == 200  # with the key
    # nothing leaked by the failed requests
    snapshot = server.engine.get_metrics()
    assert snapshot["kv_blocks_used"] == 0 and snapshot["encoder_cache_references"] == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": "Bearer"},
    ],
)
def test_api_key_required(server: RunningServer, headers: dict[str, str]) -> None:
    protected = [("POST", CHAT), ("POST", COMPLETIONS), ("GET", "/v1/models"), ("GET", "/metrics")]
    for method, path in protected:
        resp = httpx.request(method, f"{server.url}{path}", json=text_chat(), headers=headers)
        err = _assert_openai_error(resp, 401, path)
        assert err["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed


def test_unknown_route_and_method(server: RunningServer) -> None:
    _assert_openai_error(httpx.get(f"{server.url}/v1/nothing"), 401, "route without key")
    auth = {"Authorization": f"Bearer {API_KEY}"}
    _assert_openai_error(httpx.get(f"{server.url}/v1/nothing", headers=auth), 404, "route")
    resp = httpx.get(f"{server.url}{CHAT}", headers={"Authorization": f"Bearer {API_KEY}"})
    _assert_openai_error(resp, 405, "method")


def test_openai_client_exceptions(server: RunningServer) -> None:
    client = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=msgs, n=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=msgs)
    bad_key = OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model=MODEL, messages=msgs)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": data_url(png_header(9000, 9000))},
                        }
                    ],
                }
            ],
        )
    assert info.value.status_code == 413
    ok = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    assert ok.usage.completion_tokens >= 1
