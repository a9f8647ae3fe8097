"""Output text and stop strings."""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @staticmethod
    def find_stop(text: str, stops: list[str]) -> int | None:
        """Index where the earliest stop string starts, or None."""
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        return min(hits) if hits else None
