"""Chat templates in every hub layout the tiny builder writes: where mmserve finds them (vLLM's
order), the content shape it feeds them, and the rendered prompt against transformers'
``apply_chat_template`` on the same checkpoint (AutoProcessor / AutoTokenizer from the dir)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoProcessor, AutoTokenizer

from mmserve.engine.setup.chat_content_format import detect_content_format
from mmserve.engine.setup.chat_template import (
    ChatTemplate,
    find_chat_template,
    load_chat_template_arg,
)
from mmserve.engine.setup.generation_defaults import load_generation_defaults
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.chat_utils import ChatOptions, chat_to_prompt
from mmserve.models.tiny import resolve_model_path

# layout -> (where its template is found, the content format it reads, the ref object)
LAYOUTS = {
    "tiny-llava": ("chat_template.jinja", "openai", "processor"),
    "tiny-qwen2-vl": ("chat_template.jinja", "openai", "tokenizer"),
    "tiny-llava-hub": ("chat_template.json", "openai", "processor"),
    "tiny-qwen2-vl-hub": ("chat_template.json", "openai", "tokenizer"),
    "tiny-qwen3-vl": ("chat_template.jinja", "openai", "tokenizer"),
    "tiny-qwen3-vl-hub": ("chat_template.json", "openai", "tokenizer"),
    "tiny-llava-jinja": ("chat_template.jinja", "string", "tokenizer"),
}
PLACEHOLDER = {"tiny-qwen2-vl": "<|vision_start|><|image_pad|><|vision_end|>"}
TEXT = "What is in the picture?"


def template_of(layout: str) -> tuple[ChatTemplate, Any]:
    path = resolve_model_path(layout)
    text, source = find_chat_template(path)
    model_type = "qwen2_vl" if "qwen" in layout else "llava"
    return ChatTemplate.of(text, source, model_type), AutoTokenizer.from_pretrained(path)


def reference(layout: str) -> Any:
    path = resolve_model_path(layout)
    kind = LAYOUTS[layout][2]
    return (AutoProcessor if kind == "processor" else AutoTokenizer).from_pretrained(path)


def hf_render(ref: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    kwargs.setdefault("add_generation_prompt", True)
    return str(ref.apply_chat_template(messages, tokenize=False, **kwargs))


def text_parts(message: dict[str, Any]) -> dict[str, Any]:
    """String content as one text part (what mmserve hands an "openai"-format template)."""
    if not isinstance(message["content"], str):
        return message
    return {**message, "content": [{"type": "text", "text": message["content"]}]}


def conversation(content: Any) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": content},
        {"role": "assistant", "content": "A red square."},
        {"role": "user", "content": "And the colour?"},
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_template_found_in_vllm_order(layout: str) -> None:
    template, _ = template_of(layout)
    source, fmt, _ = LAYOUTS[layout]
    assert template.text is not None
    assert (template.source, template.content_format) == (source, fmt)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rendered_prompt_matches_transformers(layout: str) -> None:
    template, tokenizer = template_of(layout)
    ref = reference(layout)
    parts = [{"type": "image_url", "image_url": {"url": "x.png"}}, {"type": "text", "text": TEXT}]
    ours_parts = chat_to_prompt(tokenizer, conversation(parts), None, template).prompt
    ours_string = chat_to_prompt(tokenizer, conversation(TEXT), None, template).prompt
    if template.content_format == "openai":
        hf_parts = [{"type": "image"}, {"type": "text", "text": TEXT}]
        expected = [text_parts(m) for m in conversation(hf_parts)]
        assert ours_parts == hf_render(ref, expected)
        assert ours_string == hf_render(ref, [text_parts(m) for m in conversation(TEXT)])
    else:  # string format: images become placeholders in front of the text
        assert ours_parts == hf_render(ref, conversation("<image>\n" + TEXT))
        assert ours_string == hf_render(ref, conversation(TEXT))
    assert TEXT in ours_string and "And the colour?" in ours_string


@pytest.mark.parametrize("layout", ["tiny-qwen2-vl-hub", "tiny-qwen3-vl-hub"])
def test_video_parts_render_the_published_video_placeholder(layout: str) -> None:
    """Qwen2-VL- and Qwen3-VL-Instruct's published templates have a video branch."""
    template, tokenizer = template_of(layout)
    parts = [{"type": "video_url", "video_url": {"url": "x.mp4"}}, {"type": "text", "text": TEXT}]
    ours = chat_to_prompt(tokenizer, [{"role": "user", "content": parts}], None, template).prompt
    hf_parts = [{"type": "video"}, {"type": "text", "text": TEXT}]
    assert ours == hf_render(reference(layout), [{"role": "user", "content": hf_parts}])
    assert "<|vision_start|><|video_pad|><|vision_end|>" + TEXT in ours


def test_hub_llava_template_reads_parts_only() -> None:
    """The bug this fixes: the hub template drops plain-string content (transformers renders
    it without the text), so mmserve must hand it parts."""
    template, tokenizer = template_of("tiny-llava-hub")
    ref = reference("tiny-llava-hub")
    assert TEXT not in hf_render(ref, [{"role": "user", "content": TEXT}])
    ours = chat_to_prompt(tokenizer, [{"role": "user", "content": TEXT}], None, template)
    assert ours.prompt == f"USER: {TEXT} ASSISTANT:"


def test_string_content_stays_a_string_for_templates_that_take_both() -> None:
    template, tokenizer = template_of("tiny-qwen2-vl-hub")
    ours = chat_to_prompt(tokenizer, [{"role": "user", "content": TEXT}], None, template)
    assert ours.prompt == hf_render(tokenizer, [{"role": "user", "content": TEXT}])
    assert ours.prompt.startswith("<|im_start|>system\nYou are a helpful assistant.")


def test_chat_template_kwargs_reach_the_template() -> None:
    template, tokenizer = template_of("tiny-qwen2-vl-hub")
    parts = [{"type": "image_url", "image_url": {"url": "x.png"}}, {"type": "text", "text": TEXT}]
    messages = [{"role": "user", "content": parts}]
    plain = chat_to_prompt(tokenizer, messages, None, template).prompt
    labelled = chat_to_prompt(
        tokenizer,
        messages,
        None,
        template,
        ChatOptions(chat_template_kwargs={"add_vision_id": True}),
    ).prompt
    assert "Picture 1: " not in plain and "Picture 1: <|vision_start|>" in labelled
    with pytest.raises(ValueError, match="tokenize"):
        ChatOptions(chat_template_kwargs={"tokenize": True})


@pytest.mark.parametrize("layout", ["tiny-llava-hub", "tiny-qwen2-vl-hub", "tiny-llava-jinja"])
def test_continue_final_message_matches_transformers(layout: str) -> None:
    template, tokenizer = template_of(layout)
    messages = [
        {"role": "user", "content": TEXT},
        {"role": "assistant", "content": "It is a"},
    ]
    options = ChatOptions(add_generation_prompt=False, continue_final_message=True)
    ours = chat_to_prompt(tokenizer, messages, None, template, options).prompt
    assert ours.endswith("It is a")
    ref_messages = messages
    if template.content_format == "openai" and layout != "tiny-qwen2-vl-hub":
        ref_messages = [
            {**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages
        ]
    expected = hf_render(
        reference(layout), ref_messages, add_generation_prompt=False, continue_final_message=True
    )
    assert ours == expected
    with pytest.raises(ValueError, match="continue_final_message"):
        ChatOptions(add_generation_prompt=True, continue_final_message=True)


def test_no_template_is_a_clear_error() -> None:
    template, tokenizer = template_of("tiny-llava-no-template")
    assert template.text is None and template.source == "none"
    with pytest.raises(ValueError, match="--chat-template"):
        chat_to_prompt(tokenizer, [{"role": "user", "content": TEXT}], None, template)


def test_chat_template_flag_takes_a_file_or_the_text(tmp_path: Path) -> None:
    path = resolve_model_path("tiny-llava-no-template")
    file = tmp_path / "t.jinja"
    file.write_text("{{ messages[0]['content'] }}!")
    assert find_chat_template(path, str(file)) == (
        "{{ messages[0]['content'] }}!",
        "--chat-template",
    )
    assert load_chat_template_arg("{{ 'a' }}\\n{{ 'b' }}") == "{{ 'a' }}\n{{ 'b' }}"
    with pytest.raises(ValueError, match="looks like a file path"):
        load_chat_template_arg(str(tmp_path / "missing.jinja"))


def test_generation_config_modes(tmp_path: Path) -> None:
    path = resolve_model_path("tiny-qwen2-vl-generation-config")
    defaults = {
        "temperature": 0.01,
        "top_p": 0.001,
        "top_k": 1,
        "repetition_penalty": 1.05,
        "max_tokens": 6,
    }
    assert load_generation_defaults("auto", path) == defaults
    assert load_generation_defaults("vllm", path) == {}
    assert load_generation_defaults(str(path), resolve_model_path("tiny-llava")) == defaults
    assert load_generation_defaults("auto", resolve_model_path("tiny-llava")) == {}  # eos only
    with pytest.raises(ValueError, match="generation_config.json"):
        load_generation_defaults(str(tmp_path), path)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("temperature", "0.7"), ("top_k", 2.5), ("top_p", 0), ("max_new_tokens", "many")],
)
def test_a_generation_config_value_no_request_could_take_fails_at_load(
    tmp_path: Path, setting: str, value: object
) -> None:
    """Its defaults would otherwise fail every request that leaves the field unset."""
    (tmp_path / "generation_config.json").write_text(json.dumps({setting: value}))
    field = "max_tokens" if setting == "max_new_tokens" else setting
    with pytest.raises(ValueError, match=f"generation_config.json: {field}") as err:
        load_generation_defaults(str(tmp_path), resolve_model_path("tiny-llava"))
    assert repr(value) in str(err.value) or f"got {value}" in str(err.value)


def test_vllm_flag_names_for_the_chat_settings() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    argv = ["--mm-processor-kwargs", '{"max_pixels": 401408}', "--chat-template", "t.jinja"]
    args = EngineArgs.from_cli_args(parser.parse_args([*argv, "--generation-config", "vllm"]))
    assert args.processor_kwargs == {"max_pixels": 401408}
    assert (args.chat_template, args.generation_config) == ("t.jinja", "vllm")
    assert EngineArgs.from_kwargs(mm_processor_kwargs={"a": 1}).processor_kwargs == {"a": 1}


LOOP = "{% for m in messages %}"
END = "{% endfor %}"


@pytest.mark.parametrize(
    "template, expected",
    [
        (LOOP + "{{ m['content'] }}" + END, "string"),
        (LOOP + "{% for p in m['content'] %}{{ p.text }}{% endfor %}" + END, "openai"),
        ("{% for m in messages[1:] %}{% for p in m.content | list %}x{% endfor %}" + END, "openai"),
        (
            "{% set msgs = messages %}{% for m in msgs %}{% set c = m['content'] %}"
            "{% for p in c %}x{% endfor %}" + END,
            "openai",
        ),
        (LOOP + "{{ m['content'] | map(attribute='text') | join }}" + END, "openai"),
        (LOOP + "{% for k in m['other'] %}x{% endfor %}" + END, "string"),
        ("{% for m in messages %", "string"),  # unparsable: vLLM's default
    ],
)
def test_content_format_detection(template: str, expected: str) -> None:
    assert detect_content_format(template) == expected
