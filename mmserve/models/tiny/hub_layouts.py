"""Tiny checkpoints in the file layouts real hub repositories use (chat templates, generation
config), derived from a preset's build by moving its template files; weights are the preset's.

- ``tiny-llava-hub``: llava-1.5 as on the hub: the template only in ``chat_template.json``
  (``{"chat_template": ...}``, parts only, with ``{% generation %}``), beside
  ``processor_config.json``; none in the tokenizer files.
- ``tiny-qwen2-vl-hub``: Qwen2-VL-Instruct: ``chat_template.json`` and the tokenizer config
  both carry the template (default system prompt, image and video parts, ``add_vision_id``).
- ``tiny-qwen3-vl-hub``: Qwen3-VL-Instruct: the template (no default system prompt, image
  and video parts) in ``chat_template.json`` and the tokenizer config, and the image processor
  named as published (``Qwen2VLImageProcessorFast`` for ``Qwen3VLProcessor``).
- ``tiny-llava-jinja``: a template that reads content as text, in ``chat_template.jinja``.
- ``tiny-llava-no-template``: no chat template anywhere.
- ``tiny-smolvlm-hub``: SmolVLM-256M-Instruct: the template in ``chat_template.json`` and the
  tokenizer config.
- ``tiny-smolvlm2-hub``: SmolVLM2-*-Video-Instruct: ``SmolVLMForConditionalGeneration``, its
  image processor (with ``video_sampling``), processor and video-aware template.
- ``tiny-qwen2-vl-generation-config``: the preset plus sampling defaults in
  ``generation_config.json`` (greedy via ``top_k`` 1, as Qwen2-VL-Instruct ships, and
  ``max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .build_steps import edit_json, write_hub_chat_template, write_json
from .families.idefics3 import smolvlm2_hub, smolvlm_hub

# llava-1.5's hub template, in its shape: role prefixes, the images of a turn first, then its
# text parts; it reads content only as a list of parts.
LLAVA_HUB_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] != 'assistant' %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ part['text'] + ' ' }}{% endfor %}"
    "{% else %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ part['text'] + ' ' }}{% endgeneration %}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# One content part in the Qwen-VL-Instruct templates (Qwen2-VL's and Qwen3-VL's alike): image,
# video ("Picture N: " / "Video N: " labels when the caller passes add_vision_id) or text.
QWEN_VL_HUB_PART = (
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
)

# Qwen2-VL-Instruct's template, in its shape: a default system prompt, string or part content.
QWEN2_VL_HUB_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    + QWEN_VL_HUB_PART
    + "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-Instruct's template, in its shape: no default system prompt, string or part content.
QWEN3_VL_HUB_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    + QWEN_VL_HUB_PART
    + "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A template of the "string" content format (content read as text, images written in it).
LLAVA_TEXT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + ' ' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' + message['content'] + '</s>' }}"
    "{% else %}{{ 'USER: ' + message['content'] + ' ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

QWEN2_VL_SAMPLING_DEFAULTS: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.01,
    "top_p": 0.001,
    "top_k": 1,
    "repetition_penalty": 1.05,
    "max_new_tokens": 6,
}


def _drop_templates(out: Path) -> None:
    """Remove the chat template from every file that can hold one."""
    for name in ("chat_template.jinja", "chat_template.json"):
        (out / name).unlink(missing_ok=True)
    for name in ("tokenizer_config.json", "processor_config.json"):
        if (out / name).is_file():
            edit_json(out / name, lambda d: d.pop("chat_template", None))


def _llava_hub(out: Path) -> None:
    _drop_templates(out)
    write_json(out / "chat_template.json", {"chat_template": LLAVA_HUB_TEMPLATE})


def _qwen2_vl_hub(out: Path) -> None:
    _drop_templates(out)
    write_hub_chat_template(out, QWEN2_VL_HUB_TEMPLATE)


def _qwen3_vl_hub(out: Path) -> None:
    _drop_templates(out)
    write_hub_chat_template(out, QWEN3_VL_HUB_TEMPLATE)
    published = {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
    }
    edit_json(out / "preprocessor_config.json", lambda d: d.update(published))


def _llava_jinja(out: Path) -> None:
    _drop_templates(out)
    (out / "chat_template.jinja").write_text(LLAVA_TEXT_TEMPLATE)


def _generation_config(out: Path) -> None:
    edit_json(out / "generation_config.json", lambda d: d.update(QWEN2_VL_SAMPLING_DEFAULTS))


# layout name -> (preset it is derived from, the edit applied to that preset's files)
HUB_LAYOUTS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "tiny-llava-hub": ("tiny-llava", _llava_hub),
    "tiny-qwen2-vl-hub": ("tiny-qwen2-vl", _qwen2_vl_hub),
    "tiny-qwen3-vl-hub": ("tiny-qwen3-vl", _qwen3_vl_hub),
    "tiny-llava-jinja": ("tiny-llava", _llava_jinja),
    "tiny-llava-no-template": ("tiny-llava", _drop_templates),
    "tiny-qwen2-vl-generation-config": ("tiny-qwen2-vl", _generation_config),
    "tiny-smolvlm-hub": ("tiny-smolvlm", smolvlm_hub),
    "tiny-smolvlm2-hub": ("tiny-smolvlm", smolvlm2_hub),
}
LAYOUT_NAMES: tuple[str, ...] = tuple(HUB_LAYOUTS)
LAYOUT_VERSION = 2  # bump whenever a layout's edits change (invalidates caches)
