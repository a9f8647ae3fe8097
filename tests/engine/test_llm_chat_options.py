"""``LLM.chat``'s vLLM options: ``tools`` reach the chat template, ``mm_processor_kwargs`` the
image processor (and so the placeholder count)."""

from __future__ import annotations

import pytest

from mmserve import LLM, SamplingParams
from tests.support.server import image_messages

ONE_TOKEN = SamplingParams(temperature=0, max_tokens=1)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
TEMPLATE = (
    "{% for t in tools or [] %}{{ t.function.name }} {% endfor %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-qwen2-vl")


def test_tools_reach_the_chat_template(llm: LLM) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with_tools = llm.chat(messages, ONE_TOKEN, False, chat_template=TEMPLATE, tools=TOOLS)[0]
    plain = llm.chat(messages, ONE_TOKEN, False, chat_template=TEMPLATE)[0]
    tokenizer = llm.get_tokenizer()
    assert with_tools.prompt_token_ids == tokenizer("get_weather hi").input_ids
    assert plain.prompt_token_ids == tokenizer("hi").input_ids


def test_mm_processor_kwargs_set_the_image_size(llm: LLM) -> None:
    messages = image_messages(21, (224, 224))
    full = llm.chat(messages, ONE_TOKEN, False)[0]
    small = llm.chat(messages, ONE_TOKEN, False, mm_processor_kwargs={"max_pixels": 28 * 28 * 16})
    assert len(small[0].prompt_token_ids) < len(full.prompt_token_ids)
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.chat(messages, ONE_TOKEN, False, mm_processor_kwargs={"no_such_key": 1})
