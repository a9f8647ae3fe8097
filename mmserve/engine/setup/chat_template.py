"""Find a model's chat template in vLLM's order and describe how to feed it.

Order: ``--chat-template`` (a file, or the template text itself), ``chat_template.jinja`` in the
checkpoint, ``chat_template.json`` (``{"chat_template": ...}``, the llava-1.5 hub layout), the
tokenizer config, the processor config. None anywhere is not an error at start-up: chat
requests then fail with a message naming ``--chat-template`` (completions still work).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmserve.engine.setup.chat_content_format import ContentFormat, detect_content_format
from mmserve.engine.setup.chat_template_arg import load_chat_template_arg

NO_TEMPLATE_HELP = (
    "the model has no chat template (none in chat_template.jinja, chat_template.json, the"
    " tokenizer or processor config); start the engine with --chat-template PATH|TEMPLATE"
    " (LLM(..., chat_template=...)) or send a completion with a prompt instead"
)

# How an image is written into a plain-text message (templates of the "string" format), per
# ``hf_config.model_type``: the text the model's processor expands.
IMAGE_PLACEHOLDERS = {
    "gemma3": "<start_of_image>",
    "idefics3": "<image>",
    "llava": "<image>",
    "llava_next": "<image>",
    "llava_onevision": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "smolvlm": "<image>",
}


def _named_default(value: Any) -> str | None:
    """A template string, or the ``"default"`` one of a list of named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return str(entry.get("template"))
    return None


def _json_template(path: Path) -> str | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the chat template in {path.name}: {exc}") from None
    return _named_default(data.get("chat_template")) if isinstance(data, dict) else None


def find_chat_template(model_dir: Path, override: str | None = None) -> tuple[str | None, str]:
    """(template text or None, where it came from) in vLLM's order."""
    if override is not None:
        return load_chat_template_arg(override), "--chat-template"
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(), jinja_file.name
    for name in ("chat_template.json", "tokenizer_config.json", "processor_config.json"):
        template = _json_template(model_dir / name)
        if template is not None:
            return template, name
    return None, "none"


@dataclass(frozen=True)
class ChatTemplate:
    """A resolved chat template (or its absence) with the content format it expects."""

    text: str | None
    source: str
    content_format: ContentFormat = "string"
    image_placeholder: str | None = None

    @classmethod
    def of(cls, text: str | None, source: str, model_type: str | None) -> ChatTemplate:
        fmt = detect_content_format(text) if text is not None else "string"
        return cls(text, source, fmt, IMAGE_PLACEHOLDERS.get(model_type or ""))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, model_type: str | None = None) -> ChatTemplate:
        """The tokenizer's own template (for callers holding only a tokenizer)."""
        text = _named_default(getattr(tokenizer, "chat_template", None))
        return cls.of(text, "tokenizer", model_type)

    def render(
        self,
        tokenizer: Any,
        conversation: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        if self.text is None:
            raise ValueError(NO_TEMPLATE_HELP)
        rendered = tokenizer.apply_chat_template(
            conversation,
            chat_template=self.text,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            tools=tools,
            **(template_kwargs or {}),
        )
        return str(rendered)
