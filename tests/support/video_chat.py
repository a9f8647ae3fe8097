"""One chat about a video, for every family that takes videos: the messages, and the answer the
offline API gives (what a single server and the Ray ingress must answer too)."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from mmserve import LLM, SamplingParams
from tests.support.video import make_video

# each family that takes videos, as its tiny preset (the preset's own chat template)
VIDEO_PRESETS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-llava-onevision"]
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(make_video(12, 6)).decode()
MESSAGES: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "video_url", "video_url": {"url": VIDEO_URL}},
            {"type": "text", "text": "What happens in the video?"},
        ],
    }
]
MAX_TOKENS = 6


def offline_answer(model: str) -> tuple[str, int]:
    """(text, prompt tokens) of the offline API's greedy answer."""
    llm = LLM(model, seed=0)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    out = llm.chat(MESSAGES, params, use_tqdm=False)[0]
    return out.outputs[0].text, len(out.prompt_token_ids)


def served_answer(base_url: str, model: str) -> tuple[str, int]:
    """(text, prompt tokens) of a server's greedy answer; asserts a 200."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    reply = r.json()
    return reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens"]
