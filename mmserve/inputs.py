"""Typed inputs (no torch): what admission hands the scheduler and the worker."""

from __future__ import annotations

from dataclasses import dataclass
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
