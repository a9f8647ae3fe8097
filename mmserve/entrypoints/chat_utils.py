"""OpenAI-style chat messages -> ``PromptInput`` (text via the chat template, images, uuids,
videos).

Message content is normalized to the shape the template reads (vLLM's content format, see
``engine.chat_content_format``): a template that loops over the parts gets a list of parts
(plain-string content becomes one text part), a template that reads the content as text gets a
string (text parts joined by newlines, one image placeholder per image put in front where the
text does not already hold it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.inputs import ImageEmbeds, PromptInput
from mmserve.multimodal.handles import MediaHandle, as_handle, is_handle

# apply_chat_template's own parameters: a chat_template_kwargs entry may not replace them
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "conversation",
        "documents",
        "messages",
        "max_length",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "sanitize_control_tokens",
        "tokenize",
        "tokenizer_kwargs",
        "tools",
        "truncation",
    }
)


@dataclass(frozen=True)
class ChatOptions:
    """How one conversation is rendered: vLLM's ``add_generation_prompt`` (default True),
    ``continue_final_message`` (continue the last message instead of starting a new one) and
    ``chat_template_kwargs`` (extra template variables, e.g. ``{"add_vision_id": true}``) and
    ``tools`` (OpenAI function definitions, passed to the template as ``tools``)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        bad = sorted(RESERVED_TEMPLATE_KWARGS & set(self.chat_template_kwargs))
        if bad:
            raise ValueError(
                f"chat_template_kwargs may not set {', '.join(bad)} (use the request field of"
                " that name where there is one)"
            )


def _part_source(part: dict[str, Any], kind: str, where: str) -> Any:
    source = part.get(kind)
    if isinstance(source, dict):
        source = source.get("url")
    if source is None and kind in ("image_url", "image") and part.get("uuid") is not None:
        return MediaHandle(uuid=part["uuid"])  # vLLM: a uuid without data names a sent image
    if source is None:
        raise ValueError(f"{where} has no {kind.removesuffix('_url')}")
    if is_handle(source):
        return as_handle(source)
    return source


def _embeds(part: dict[str, Any], where: str) -> ImageEmbeds:
    """vLLM's ``image_embeds`` part: a tensor, or ``{"image_embeds", "image_grid_thw"}``."""
    value: Any = part.get("image_embeds")
    grid: Any = None
    if isinstance(value, dict):
        value, grid = value.get("image_embeds"), value.get("image_grid_thw")
    if value is None:
        raise ValueError(f"{where} has no image_embeds")
    if part.get("uuid") is not None:
        raise ValueError(f"{where}: image_embeds take no uuid: they are keyed by their content")
    if isinstance(value, str):
        raise ValueError(
            f"{where}: image_embeds given as serialized tensors are decoded by the server only"
            " (started with --enable-mm-embeds); offline, pass the tensor itself"
        )
    return ImageEmbeds(value, grid)


def parse_chat_messages(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[Any], list[str | None], list[Any]]:
    """Split content parts into template-ready messages plus the images and the videos, each
    in prompt order.

    Accepted parts: {"type": "text", "text"}, {"type": "image_url", "image_url": {"url"} | url,
    "uuid"?}, {"type": "image", "image": PIL.Image | path | bytes, "uuid"?} (a url
    ``mmserve://<handle>``, or a uuid without data, names an image encoded before: a
    ``MediaHandle``), {"type": "image_embeds", "image_embeds": tensor | {"image_embeds",
    "image_grid_thw"}} (an ``ImageEmbeds``; the server decodes serialized ones first), {"type":
    "video_url", "video_url": {"url"} | url}, {"type": "video", "video": path | bytes |
    frames}; the template sees {"type": "image"} / {"type": "video"}. String content stays a
    string; ``name`` is passed to the template.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    conv: list[dict[str, Any]] = []
    images: list[Any] = []
    uuids: list[str | None] = []
    videos: list[Any] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        extra = _message_extras(msg)
        content = msg.get("content")
        if content is None or isinstance(content, str):
            conv.append({"role": msg["role"], "content": content, **extra})
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind in ("image_url", "image"):
                source = _part_source(part, kind, f"messages[{i}].content[{j}]")
                images.append(source)
                uuids.append(None if isinstance(source, MediaHandle) else part.get("uuid"))
                parts.append({"type": "image"})
            elif kind == "image_embeds":
                images.append(_embeds(part, f"messages[{i}].content[{j}]"))
                uuids.append(None)
                parts.append({"type": "image"})
            elif kind in ("video_url", "video"):
                if part.get("uuid") is not None:
                    raise ValueError(f"messages[{i}].content[{j}]: video parts take no uuid")
                videos.append(_part_source(part, kind, f"messages[{i}].content[{j}]"))
                parts.append({"type": "video"})
            else:
                raise ValueError(f"messages[{i}].content[{j}] has unsupported type {kind!r}")
        conv.append({"role": msg["role"], "content": parts, **extra})
    return conv, images, uuids, videos


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as templates read it: ``arguments`` a dict where it is a JSON object (HF
    templates write ``arguments | tojson``), as vLLM passes it."""
    function = dict(call.get("function") or {})
    try:
        arguments = json.loads(function.get("arguments") or "{}")
        if isinstance(arguments, dict):
            function["arguments"] = arguments
    except (TypeError, ValueError):
        pass
    return {**call, "function": function}


def _message_extras(msg: dict[str, Any]) -> dict[str, Any]:
    """``name``, ``tool_calls`` and ``tool_call_id`` of a message, as the template reads them."""
    extra: dict[str, Any] = {}
    if msg.get("name") is not None:
        extra["name"] = msg["name"]
    if msg.get("tool_calls"):
        extra["tool_calls"] = [_template_tool_call(c) for c in msg["tool_calls"]]
    if msg.get("tool_call_id") is not None:
        extra["tool_call_id"] = msg["tool_call_id"]
    return extra


def normalize_content(conv: list[dict[str, Any]], template: ChatTemplate) -> list[dict[str, Any]]:
    """Each message's content in the shape ``template`` reads (see the module docstring)."""
    out = []
    for msg in conv:
        content = msg["content"]
        if template.content_format == "openai":
            if content is None:
                content = []
            elif isinstance(content, str):
                content = [{"type": "text", "text": content}]
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            content = _as_text(content, template.image_placeholder)
        out.append({**msg, "content": content})
    return out


def _as_text(parts: list[dict[str, Any]], placeholder: str | None) -> str:
    if any(p["type"] == "video" for p in parts):
        raise ValueError(
            "the chat template reads message content as text, so it cannot place a video; use"
            " a template that loops over content parts"
        )
    text = "\n".join(p["text"] for p in parts if p["type"] == "text")
    num_images = sum(p["type"] == "image" for p in parts)
    if num_images and placeholder is None:
        raise ValueError(
            "the chat template reads message content as text and mmserve does not know this"
            " model's image placeholder; use a template that loops over content parts"
        )
    missing = max(0, num_images - text.count(placeholder)) if placeholder else 0
    return "\n".join([placeholder or ""] * missing + [text])


def render_chat(
    tokenizer: Any,
    conv: list[dict[str, Any]],
    template: ChatTemplate | None = None,
    options: ChatOptions | None = None,
) -> str:
    """Parsed messages -> prompt text (``template`` default: the tokenizer's own). A leading
    bos the template writes (Gemma 3's does) is left to the tokenizer when it adds one itself,
    so the prompt has one bos, as transformers' ``apply_chat_template(tokenize=True)``."""
    template = template if template is not None else ChatTemplate.from_tokenizer(tokenizer)
    options = options or ChatOptions()
    text = template.render(
        tokenizer,
        normalize_content(conv, template),
        add_generation_prompt=options.add_generation_prompt,
        continue_final_message=options.continue_final_message,
        template_kwargs=options.chat_template_kwargs,
        tools=options.tools,
    )
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def _adds_bos(tokenizer: Any) -> bool:
    ids = tokenizer("")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def chat_to_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    cache_salt: str | None = None,
    template: ChatTemplate | None = None,
    options: ChatOptions | None = None,
) -> PromptInput:
    """The one chat -> prompt conversion (offline API, server, benchmarks)."""
    conv, images, uuids, videos = parse_chat_messages(messages)
    prompt = render_chat(tokenizer, conv, template, options)
    has_uuids = any(u is not None for u in uuids)
    return PromptInput(prompt, images, uuids if has_uuids else None, cache_salt, videos=videos)
