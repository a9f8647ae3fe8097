"""``POST /v1/mm/encode`` with a ``video_url`` part through a real Qwen2-VL server: a video item
in content order among the images, then a chat naming its handle encodes nothing and answers as
the video does; other tenants, an image handle as a video and a video handle as an image are
400s with a clear ``code``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from mmserve.entrypoints.openai.server import RunningServer
from tests.support.server import image_messages
from tests.support.video_chat import VIDEO_URL

MODEL = "tiny-qwen2-vl"
ENCODE, CHAT = "/v1/mm/encode", "/v1/chat/completions"


def video_part(url: str = VIDEO_URL) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def image_part(url: str | None = None) -> dict:
    if url is not None:
        return {"type": "image_url", "image_url": {"url": url}}
    return image_messages(3, (64, 48))[0]["content"][0]


def chat(part: dict, **extra) -> dict:
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]
    return {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, **extra}


def encoded(server: RunningServer) -> float:
    return server.engine.get_metrics()["encoder_images_encoded"]


@pytest.fixture(scope="module")
def served(serve_model) -> Iterator[tuple[RunningServer, httpx.Client]]:
    flags = ["--limit-mm-per-prompt", '{"image": 2, "video": 1}', "--skip-server-warmup"]
    with serve_model(MODEL, *flags) as srv:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            yield srv, client


def test_encode_a_video_then_chat_by_handle(served):
    server, http = served
    before = encoded(server)
    resp = http.post(ENCODE, json={"model": MODEL, "content": [video_part()]})
    assert resp.status_code == 200, resp.text
    [item] = resp.json()["items"]
    assert item["type"] == "video" and item["tokens"] > 0 and len(item["handle"]) == 64
    pieces = encoded(server) - before
    assert pieces >= 2
    before = encoded(server)
    by_handle = http.post(CHAT, json=chat(video_part(f"mmserve://{item['handle']}")))
    assert by_handle.status_code == 200, by_handle.text
    assert encoded(server) - before == 0
    sent = http.post(CHAT, json=chat(video_part(), cache_salt="elsewhere")).json()
    assert encoded(server) - before == pieces
    assert by_handle.json()["choices"][0]["message"] == sent["choices"][0]["message"]
    assert by_handle.json()["usage"]["prompt_tokens"] == sent["usage"]["prompt_tokens"]


def test_items_in_content_order_and_handles_within_tenant_and_kind(served):
    _, http = served
    body = {"model": MODEL, "content": [image_part(), video_part()], "cache_salt": "a"}
    resp = http.post(ENCODE, json=body)
    assert resp.status_code == 200, resp.text
    image, video = resp.json()["items"]
    assert (image["type"], video["type"]) == ("image", "video")
    cases = [
        (video_part(f"mmserve://{video['handle']}"), "b", "media_handle_not_found"),
        (image_part(f"mmserve://{video['handle']}"), "a", "media_handle_kind"),
        (video_part(f"mmserve://{image['handle']}"), "a", "media_handle_kind"),
    ]
    for part, salt, code in cases:
        resp = http.post(CHAT, json=chat(part, cache_salt=salt))
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == code, resp.text
    ok = http.post(CHAT, json=chat(video_part(f"mmserve://{video['handle']}"), cache_salt="a"))
    assert ok.status_code == 200, ok.text
