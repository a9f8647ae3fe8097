"""``video_url`` content parts through a real Qwen2-VL server: parsing and the chat template's
video placeholder, ``--limit-mm-per-prompt`` video counts and ``mm_processor_kwargs`` checked
before anything is fetched, the fetch policy's errors, limits as 413s, and the decoded frames
handed to the engine, and a whole video chat."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.engine.setup.loading import load_tokenizer
from mmserve.entrypoints.chat_utils import chat_to_prompt, parse_chat_messages
from mmserve.entrypoints.openai.server import RunningServer
from mmserve.inputs import PromptInput, VideoFrames
from mmserve.models.tiny import resolve_model_path
from tests.support.server import openai_client
from tests.support.video import frame_index, make_video

MODEL = "tiny-qwen2-vl"
VIDEO = make_video(90, 30)
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(VIDEO).decode()
# Qwen2-VL's own template's content loop, given with --chat-template
TEMPLATE = (
    "{%- for message in messages -%}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content -%}{{ content['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def video_messages(*urls: str, text: str = "What happens?") -> list[dict]:
    parts: list[dict[str, Any]] = [{"type": "video_url", "video_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, serve_model) -> Iterator[RunningServer]:
    template = tmp_path_factory.mktemp("template") / "qwen2_vl.jinja"
    template.write_text(TEMPLATE)
    with serve_model(
        MODEL,
        "--limit-mm-per-prompt", '{"image": 2, "video": 1}',
        "--chat-template", str(template),
        "--max-video-bytes", str(len(VIDEO) + 100),
    ) as srv:  # fmt: skip
        yield srv


def post(server: RunningServer, messages: list[dict], **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0, **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


def test_video_parts_reach_the_template_as_video_placeholders() -> None:
    messages = video_messages(VIDEO_URL, "https://v.example/b.mp4")
    messages[0]["content"].insert(1, {"type": "video", "video": b"raw"})
    conv, images, uuids, videos = parse_chat_messages(messages)
    assert images == [] and uuids == []
    assert videos == [VIDEO_URL, b"raw", "https://v.example/b.mp4"]
    assert [p["type"] for p in conv[0]["content"]] == ["video", "video", "video", "text"]

    tokenizer = load_tokenizer(resolve_model_path(MODEL))
    template = ChatTemplate.of(TEMPLATE, "test", "qwen2_vl")
    inp = chat_to_prompt(tokenizer, video_messages(VIDEO_URL), template=template)
    assert "<|vision_start|><|video_pad|><|vision_end|>What happens?" in inp.prompt
    assert inp.videos == [VIDEO_URL] and inp.images == []
    as_text = ChatTemplate.of("{{ messages[0]['content'] }}", "test", "qwen2_vl")
    with pytest.raises(ValueError, match="cannot place a video"):
        chat_to_prompt(tokenizer, video_messages(VIDEO_URL), template=as_text)
    with_uuid = video_messages(VIDEO_URL)
    with_uuid[0]["content"][0]["uuid"] = "clip-1"
    with pytest.raises(ValueError, match="video parts take no uuid"):
        parse_chat_messages(with_uuid)


def test_decoded_frames_reach_the_engine(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    admission = server.engine.admission
    decoded: list[VideoFrames] = []
    real_decode = admission.decode_video

    async def decode(*args: Any) -> VideoFrames:
        decoded.append(await real_decode(*args))
        return decoded[-1]

    monkeypatch.setattr(admission, "decode_video", decode)
    prompts: list[str] = []
    engine = server.engine.engine
    real = engine.intake.process

    def process(prompt: PromptInput) -> Any:
        prompts.append(prompt.prompt)
        return real(prompt)

    monkeypatch.setattr(engine.intake, "process", process)
    reply = post(server, video_messages(VIDEO_URL), mm_processor_kwargs={"num_frames": 4})
    assert reply.status_code == 200, reply.text
    (video,) = decoded
    assert [frame_index(f) for f in video.frames] == [0, 22, 45, 67]
    assert video.timestamps == pytest.approx([0, 22 / 30, 1.5, 67 / 30])
    assert "<|vision_start|><|video_pad|><|vision_end|>" in prompts[0]
    vllm_style = {"fps": 0.5, "do_sample_frames": True}  # as vLLM's Qwen examples send it
    assert (
        post(server, video_messages(VIDEO_URL), mm_processor_kwargs=vllm_style).status_code == 200
    )
    assert [frame_index(f) for f in decoded[-1].frames] == [0, 22, 45, 67]  # min_frames 4


def test_video_count_and_settings_are_checked_before_any_fetch(server: RunningServer, bait) -> None:
    url = f"{bait.url}/clip.mp4"
    reply = post(server, video_messages(url, url))
    assert reply.status_code == 400
    assert "2 videos exceed the limit of 1 per prompt" in reply.json()["error"]["message"]
    reply = post(server, video_messages(url), mm_processor_kwargs={"fps": 1, "num_frames": 4})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "mm_processor_kwargs"
    assert bait.connections == 0
    reply = post(server, video_messages(url))  # loopback: refused by the policy, not fetched
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == f"could not fetch video from {url}"
    assert bait.connections == 0


@pytest.mark.parametrize(
    "source,status,message",
    [
        ("data:video/mp4;base64," + base64.b64encode(b"x" * 60).decode(), 400, "could not decode"),
        ("data:video/mp4;base64,@@", 400, "invalid base64 in video data URL"),
        ("/etc/hostname", 400, "could not fetch video from /etc/hostname"),  # no local media
        ("data:video/mp4;base64," + base64.b64encode(VIDEO * 2).decode(), 413, "video data URL"),
    ],
)
def test_bad_videos_are_openai_errors(
    server: RunningServer, source: str, status: int, message: str
) -> None:
    reply = post(server, video_messages(source))
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and "Traceback" not in reply.text
    if status == 413:
        assert error["code"] == "video_too_large"
    assert post(server, [{"role": "user", "content": "hi"}]).status_code == 200


def test_video_chat_end_to_end(server: RunningServer, tmp_path: Path) -> None:
    client = openai_client(server)
    reply = client.chat.completions.create(
        model=MODEL, messages=video_messages(VIDEO_URL), max_tokens=4, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    text_only = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What happens?"}]}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + 6
