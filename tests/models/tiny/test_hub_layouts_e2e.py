"""Every hub layout the tiny builder writes, loaded and chatted with through a real server on
127.0.0.1 and through ``LLM.chat``: greedy outputs equal generating from the prompt that
transformers' ``apply_chat_template`` renders on the same checkpoint. Also the layout without
a template (a 400 naming ``--chat-template``), generation-config defaults and the default
``max_tokens`` (the room left in the context)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import make_image
from openai import BadRequestError, OpenAI

from mmserve import LLM, SamplingParams
from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread
from mmserve.models.tiny.hub_layouts import LLAVA_TEXT_TEMPLATE
from tests.serving.test_chat_templates import hf_render, reference, text_parts

GREEDY = SamplingParams(temperature=0, max_tokens=8)
TEXT = "What is in the picture?"
IMAGE = make_image(3, (64, 48))


def data_url() -> str:
    buf = io.BytesIO()
    IMAGE.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def serve(model: str, *flags: str) -> Any:
    argv = ["serve", "--model", model, "--port", "0", "--uvicorn-log-level", "warning", *flags]
    return serve_in_thread(build_parser().parse_args(argv))


def client_of(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def expected_prompt(layout: str, llm: LLM, with_image: bool) -> str:
    """What transformers renders for the same conversation, in the shape the template reads."""
    content: list[dict[str, Any]] = [{"type": "image"}] if with_image else []
    content.append({"type": "text", "text": TEXT})
    messages = [{"role": "user", "content": content}]
    if llm.engine.chat_template.content_format == "string":
        messages = [{"role": "user", "content": "<image>\n" * with_image + TEXT}]
    else:
        messages = [text_parts(m) for m in messages]
    return hf_render(reference(layout), messages)


@pytest.fixture(
    scope="module",
    params=["tiny-llava-hub", "tiny-qwen2-vl-hub", "tiny-qwen3-vl-hub", "tiny-llava-jinja"],
)
def layout(request: pytest.FixtureRequest) -> Iterator[tuple[str, LLM, RunningServer]]:
    with serve(request.param) as server:
        yield request.param, LLM(request.param), server


@pytest.mark.parametrize("with_image", [False, True])
def test_layout_chats_like_transformers_renders(
    layout: tuple[str, LLM, RunningServer], with_image: bool
) -> None:
    name, llm, server = layout
    parts: list[dict[str, Any]] = [{"type": "text", "text": TEXT}]
    if with_image:
        parts.insert(0, {"type": "image_url", "image_url": {"url": data_url()}})
    contents: list[Any] = [parts] if with_image else [parts, TEXT]  # part array and plain string
    prompt = expected_prompt(name, llm, with_image)
    ref = llm.generate({"prompt": prompt, "images": [IMAGE] * with_image}, GREEDY, use_tqdm=False)
    want = ref[0].outputs[0]
    for content in contents:
        messages = [{"role": "user", "content": content}]
        got = llm.chat(messages, GREEDY, use_tqdm=False)[0]
        assert got.prompt_token_ids == ref[0].prompt_token_ids
        assert got.outputs[0].token_ids == want.token_ids
        resp = client_of(server).chat.completions.create(
            model=name, messages=messages, temperature=0, max_tokens=8
        )
        assert resp.choices[0].message.content == want.text
        assert resp.usage.prompt_tokens == len(ref[0].prompt_token_ids)


def test_no_template_is_a_400_naming_the_flag_and_completions_work() -> None:
    name = "tiny-llava-no-template"
    with serve(name, "--max-model-len", "64") as server:
        client = client_of(server)
        with pytest.raises(BadRequestError, match="--chat-template"):
            client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": TEXT}], max_tokens=2
            )
        # max_tokens unset: the room left in the context
        resp = client.completions.create(
            model=name, prompt="USER: hi ASSISTANT:", temperature=0, extra_body={"ignore_eos": True}
        )
        assert resp.usage.prompt_tokens + resp.usage.completion_tokens == 64
        assert resp.choices[0].finish_reason == "length"
        body = {"messages": [{"role": "user", "content": TEXT}], "continue_final_message": True}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and "add_generation_prompt" in r.text
    with pytest.raises(ValueError, match="--chat-template"):
        LLM(name).chat([{"role": "user", "content": TEXT}], GREEDY, use_tqdm=False)


def test_chat_template_setting_fixes_a_model_without_one() -> None:
    llm = LLM("tiny-llava-no-template", chat_template=LLAVA_TEXT_TEMPLATE, max_model_len=64)
    out = llm.chat([{"role": "user", "content": TEXT}], GREEDY, use_tqdm=False)[0]
    want = llm.generate(f"USER: {TEXT} ASSISTANT:", GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == want.outputs[0].token_ids
    # max_tokens unset in LLM.generate: the room left in the context
    [long] = llm.generate(
        "USER: hi ASSISTANT:", SamplingParams(temperature=0, ignore_eos=True), False
    )
    assert len(long.prompt_token_ids) + len(long.outputs[0].token_ids) == 64


def test_generation_config_defaults_apply_where_the_request_is_silent() -> None:
    """The layout's generation_config.json is greedy (top_k 1) with max_new_tokens 6."""
    name = "tiny-qwen2-vl-generation-config"
    messages = [{"role": "user", "content": TEXT}]
    with serve(name) as server:
        client = client_of(server)
        plain = client.chat.completions.create(
            model=name, messages=messages, extra_body={"ignore_eos": True}
        )
        greedy = client.chat.completions.create(
            model=name, messages=messages, temperature=0, extra_body={"ignore_eos": True}
        )
        assert plain.usage.completion_tokens == greedy.usage.completion_tokens == 6
        assert plain.choices[0].message.content == greedy.choices[0].message.content
        longer = client.chat.completions.create(
            model=name, messages=messages, max_tokens=9, extra_body={"ignore_eos": True}
        )
        assert longer.usage.completion_tokens == 9  # an explicit max_tokens wins
    llm = LLM(name)
    assert llm.engine.generation_defaults["max_tokens"] == 6
    default = llm.chat(messages, use_tqdm=False)[0].outputs[0]
    zero = llm.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert default.token_ids == zero.outputs[0].token_ids
    assert LLM(name, generation_config="vllm").engine.generation_defaults == {}
