"""OpenAI-style chat messages -> ``PromptInput`` (text via the chat template, images, uuids)."""

from __future__ import annotations

from typing import Any

from mmserve.inputs import PromptInput


def parse_chat_messages(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[Any], list[str | None]]:
    """Split content parts into template-ready messages plus the images in prompt order.

    Accepted parts: {"type": "text", "text"}, {"type": "image_url", "image_url": {"url"} | url,
    "uuid"?}, {"type": "image", "image": PIL.Image | path | bytes, "uuid"?}.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    conv: list[dict[str, Any]] = []
    images: list[Any] = []
    uuids: list[str | None] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            conv.append({"role": msg["role"], "content": content or ""})
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind in ("image_url", "image"):
                source = part.get(kind)
                if isinstance(source, dict):
                    source = source.get("url")
                if source is None:
                    raise ValueError(f"messages[{i}].content[{j}] has no image")
                images.append(source)
                uuids.append(part.get("uuid"))
                parts.append({"type": "image"})
            else:
                raise ValueError(f"messages[{i}].content[{j}] has unsupported type {kind!r}")
        conv.append({"role": msg["role"], "content": parts})
    return conv, images, uuids


def chat_to_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], cache_salt: str | None = None
) -> PromptInput:
    """The one chat -> prompt conversion (offline API, server, benchmarks)."""
    conv, images, uuids = parse_chat_messages(messages)
    prompt = render_chat(tokenizer, conv)
    has_uuids = any(u is not None for u in uuids)
    return PromptInput(prompt, images, uuids if has_uuids else None, cache_salt)


def render_chat(tokenizer: Any, conv: list[dict[str, Any]]) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the model has no chat template; use generate() with a prompt")
    return tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
