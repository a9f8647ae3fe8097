"""``POST /v1/mm/encode`` and chat by handle through a real server: encode ahead, then the chat
naming the handle encodes nothing and answers as the image does (tiny-llava, tiny-qwen2-vl);
handles stay within their tenant; an evicted one, a malformed or unknown one, a wrong model, too
many images and an internal URL are 4xx with a clear message, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from mmserve.entrypoints.openai.server import RunningServer
from tests.support.server import image_messages

ENCODE, CHAT = "/v1/mm/encode", "/v1/chat/completions"


def image_part(seed: int) -> dict:
    return image_messages(seed, (64, 48))[0]["content"][0]


def handle_chat(model: str, part: dict, **extra) -> dict:
    content = [part, {"type": "text", "text": "What is in the picture?"}]
    messages = [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def by_handle(handle: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"mmserve://{handle}"}}


def encoded(server: RunningServer) -> float:
    return server.engine.get_metrics()["encoder_images_encoded"]


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


@pytest.fixture(scope="module", params=["tiny-llava", "tiny-qwen2-vl"])
def served(request, serve_model, bait) -> Iterator[tuple[str, RunningServer, httpx.Client]]:
    flags = ["--limit-mm-per-prompt", '{"image": 2}', "--encoder-cache-size", "600"]
    flags.append("--skip-server-warmup")  # nothing here measures time
    with serve_model(request.param, *flags) as srv:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            yield request.param, srv, client


def test_encode_then_chat_by_handle(served):
    model, server, http = served
    before = encoded(server)
    resp = http.post(ENCODE, json={"model": model, "content": [image_part(1)]})
    assert resp.status_code == 200, resp.text
    [item] = resp.json()["items"]
    assert item["type"] == "image" and item["tokens"] > 0 and len(item["handle"]) == 64
    assert encoded(server) - before == 1
    before = encoded(server)
    chat = http.post(CHAT, json=handle_chat(model, by_handle(item["handle"]))).json()
    assert encoded(server) - before == 0
    [usage] = chat["usage"]["mm_inputs"]
    assert usage["source"] == "encoder_cache" and usage["tokens"] == item["tokens"]
    sent = http.post(CHAT, json=handle_chat(model, image_part(1), cache_salt="elsewhere")).json()
    assert encoded(server) - before == 1  # another tenant: encoded again
    assert chat["choices"][0]["message"] == sent["choices"][0]["message"]
    assert chat["usage"]["prompt_tokens"] == sent["usage"]["prompt_tokens"]


def test_handle_of_tenant_a_is_refused_for_tenant_b(served):
    model, _, http = served
    body = {"model": model, "content": [image_part(2)], "cache_salt": "a"}
    [item] = http.post(ENCODE, json=body).json()["items"]
    ok = http.post(CHAT, json=handle_chat(model, by_handle(item["handle"]), cache_salt="a"))
    assert ok.status_code == 200
    for salt in ("b", None):
        extra = {"cache_salt": salt} if salt else {}
        resp = http.post(CHAT, json=handle_chat(model, by_handle(item["handle"]), **extra))
        err = error_of(resp, 400)
        assert err["code"] == "media_handle_not_found" and "send the image again" in err["message"]


def test_evicted_handle_is_a_400_asking_for_the_image(served):
    model, _, http = served
    big = [image_messages(seed, (224, 224))[0]["content"][0] for seed in range(10, 30)]
    body = {"model": model, "content": [big[0]]}
    [first] = http.post(ENCODE, json=body).json()["items"]
    fill = 600 // first["tokens"] + 1  # the cache holds 600 embeddings: the first goes
    for part in big[1 : 1 + fill]:
        assert http.post(ENCODE, json={"model": model, "content": [part]}).is_success
    err = error_of(http.post(CHAT, json=handle_chat(model, by_handle(first["handle"]))), 400)
    assert err["code"] == "media_handle_expired" and "send the image again" in err["message"]


def test_bad_inputs_are_4xx_and_the_server_keeps_serving(served, bait):
    model, server, http = served
    cases = [
        (CHAT, handle_chat(model, by_handle("ab" * 32)), 400, "unknown"),
        (CHAT, handle_chat(model, by_handle("xyz")), 400, "malformed media handle"),
        (ENCODE, {"model": "other-model", "content": [image_part(7)]}, 404, "does not exist"),
        (ENCODE, {"model": model, "content": [image_part(i) for i in range(3)]}, 400, "limit"),
        (ENCODE, {"model": model, "content": [by_handle("ab" * 32)]}, 400, "no media handles"),
        (ENCODE, {"model": model, "content": []}, 400, "content"),
        # precomputed embeddings need --enable-mm-embeds (test_server_image_embeds.py)
        (
            CHAT,
            handle_chat(model, {"type": "image_embeds", "image_embeds": "aGk="}),
            400,
            "--enable-mm-embeds",
        ),  # fmt: skip
        (ENCODE, {"model": model, "content": [{"type": "text", "text": "hi"}]}, 400, "images"),
        (
            ENCODE,
            {
                "model": model,
                "content": [{"type": "image_url", "image_url": {"url": f"{bait.url}/image.png"}}],
            },
            400,
            "could not fetch image",
        ),
    ]
    for path, body, status, words in cases:
        err = error_of(http.post(path, json=body), status)
        assert words in err["message"], (body, err)
    assert bait.connections == 0
    assert http.get("/health").status_code == 200
    assert http.post(CHAT, json=handle_chat(model, image_part(8))).status_code == 200
    text = http.get("/metrics").text
    assert 'endpoint="/v1/mm/encode"' in text
