"""Per-request ``mm_processor_kwargs`` through a real Qwen2-VL server and the ``openai`` client:
the setting changes the image's placeholder count (usage and /tokenize agree), the same image
under two settings is encoded twice, bad keys are 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from mmserve.entrypoints.openai.server import RunningServer
from tests.support.server import image_messages, openai_client

MODEL = "tiny-qwen2-vl"


def _messages() -> list[dict]:
    return image_messages(21, (224, 224))


SMALL = {"max_pixels": 28 * 28 * 16}


@pytest.fixture(scope="module")
def server(serve_model) -> Iterator[RunningServer]:
    with serve_model(MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return openai_client(server)


def test_two_settings_of_one_image(client, server):
    messages = _messages()
    before = server.engine.get_metrics()["encoder_images_encoded"]
    kwargs = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    plain = client.chat.completions.create(**kwargs)
    small = client.chat.completions.create(**kwargs, extra_body={"mm_processor_kwargs": SMALL})
    assert plain.usage.prompt_tokens - small.usage.prompt_tokens == 64 - 16
    assert small.usage.prompt_tokens_details.cached_tokens == 0
    assert server.engine.get_metrics()["encoder_images_encoded"] - before == 2
    counts = [
        httpx.post(
            f"{server.url}/tokenize",
            json={"model": MODEL, "messages": messages, **extra},
            timeout=30,
        ).json()["count"]
        for extra in ({}, {"mm_processor_kwargs": SMALL})
    ]
    assert counts == [plain.usage.prompt_tokens, small.usage.prompt_tokens]


@pytest.mark.parametrize("bad", [{"do_resize": False}, {"max_pixels": 0}])
def test_bad_kwargs_are_400s_naming_the_field(client, server, bad):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=_messages(), max_tokens=2, extra_body={"mm_processor_kwargs": bad}
        )
    assert info.value.body["param"] == "mm_processor_kwargs"
    assert "mm_processor_kwargs" in info.value.body["message"]
    resp = httpx.post(
        f"{server.url}/tokenize",
        json={"model": MODEL, "messages": _messages(), "mm_processor_kwargs": bad},
        timeout=30,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "mm_processor_kwargs"
    with pytest.raises(openai.BadRequestError) as info:  # completions carry no images here
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_body={"mm_processor_kwargs": SMALL}
        )
    assert info.value.body["param"] == "mm_processor_kwargs"
