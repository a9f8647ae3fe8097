"""A Qwen3-VL server takes a request's video sampling keys (``fps``, ``num_frames``, ...) in
``mm_processor_kwargs`` as a Qwen2-VL server does: a 200 whose prompt has the frames asked for,
and a 400 naming the field for a bad combination."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mmserve.entrypoints.openai.server import RunningServer
from tests.serving.video.test_server_video import TEMPLATE, VIDEO, VIDEO_URL, video_messages

MODEL = "tiny-qwen3-vl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, serve_model) -> Iterator[RunningServer]:
    template = tmp_path_factory.mktemp("template") / "qwen3_vl.jinja"
    template.write_text(TEMPLATE)  # Qwen2-VL's content loop: Qwen3-VL's video placeholder too
    with serve_model(
        MODEL,
        "--limit-mm-per-prompt", '{"image": 1, "video": 1}',
        "--chat-template", str(template),
        "--max-video-bytes", str(len(VIDEO) + 100),
    ) as srv:  # fmt: skip
        yield srv


def post(server: RunningServer, **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": video_messages(VIDEO_URL),
        "max_tokens": 2,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


def test_video_sampling_keys_are_accepted_and_applied(server: RunningServer) -> None:
    groups = {}
    for frames in (4, 8):
        reply = post(server, mm_processor_kwargs={"num_frames": frames})
        assert reply.status_code == 200, reply.text
        groups[frames] = reply.json()["usage"]["prompt_tokens"]
    default = post(server)  # 3 s at the checkpoint's 2 fps: 6 frames
    assert default.status_code == 200, default.text
    assert groups[4] < default.json()["usage"]["prompt_tokens"] < groups[8]
    vllm_style = {"fps": 0.5, "min_frames": 2, "max_frames": 64, "do_sample_frames": True}
    reply = post(server, mm_processor_kwargs=vllm_style)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] < groups[4]  # 2 frames: one group


def test_bad_sampling_keys_are_400s_naming_the_field(server: RunningServer) -> None:
    for bad in ({"fps": 1.0, "num_frames": 4}, {"fps": 0}, {"do_sample_frames": False}):
        reply = post(server, mm_processor_kwargs=bad)
        assert reply.status_code == 400, (bad, reply.text)
        assert reply.json()["error"]["param"] == "mm_processor_kwargs"
