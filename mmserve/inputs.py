"""Typed inputs (no torch): what admission hands the scheduler and the worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MultiModalItem:
    """One image of a prompt: its content hash and placeholder range [offset, offset+length)."""

    hash: str
    offset: int
    length: int
    data: Any = None  # processor output (e.g. pixel_values array) the encoder consumes

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def key(self) -> str:
        """Encoder-cache key: the content hash and the embedding count, so two items whose
        hashes collide but whose lengths differ are two entries, never a wrong splice."""
        return f"{self.hash}:{self.length}"


@dataclass
class ProcessedPrompt:
    """A prompt after admission: token ids with each image's placeholders expanded, and one
    ``MultiModalItem`` per image in prompt order."""

    prompt_token_ids: list[int]
    mm_items: list[MultiModalItem]


@dataclass
class PromptInput:
    """One prompt as the APIs take it: text or token ids, its images (any source admission
    reads) in prompt order, optional per-image uuids, the tenant's cache salt and this
    prompt's image processor settings (``mm_processor_kwargs``, merged over the engine's)."""

    prompt: str | list[int]
    images: list[Any] = field(default_factory=list)
    uuids: list[str | None] | None = None
    cache_salt: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None

    @classmethod
    def of(cls, prompt: Any) -> PromptInput:
        """A str / token-id list / ``{"prompt" | "prompt_token_ids", "images" |
        "multi_modal_data", "uuids", "cache_salt", "mm_processor_kwargs"}`` dict ->
        PromptInput."""
        if isinstance(prompt, cls):
            return prompt
        if isinstance(prompt, (str, list)):
            return cls(prompt)
        if isinstance(prompt, dict):
            text = prompt.get("prompt", prompt.get("prompt_token_ids"))
            if text is None:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            images = prompt.get("images", prompt.get("multi_modal_data", {}).get("image", []))
            images = list(images) if isinstance(images, (list, tuple)) else [images]
            return cls(
                text,
                images,
                prompt.get("uuids"),
                prompt.get("cache_salt"),
                prompt.get("mm_processor_kwargs"),
            )
        raise ValueError(f"unsupported prompt of type {type(prompt).__name__}")
