"""Incremental output text and stop strings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class _TextState:
    text: str = ""
    prefix_offset: int = 0  # tokens before this are settled in ``text``
    read_offset: int = 0  # tokens in [prefix_offset, read_offset) give context for the next one


class Detokenizer:
    """Per-request incremental detokenization.

    Each new token costs a decode of a handful of tokens (the settled context plus the new ones),
    not of the whole output. Text is only appended once it no longer ends in an incomplete UTF-8
    sequence (U+FFFD), so byte-level BPE pieces never show up half-decoded; ``finish`` flushes.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _TextState] = {}

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def update(self, req_id: str, token_ids: list[int]) -> str:
        """Text of ``token_ids`` (the request's whole output so far), extended incrementally."""
        state = self._states.setdefault(req_id, _TextState())
        prefix = self._decode(token_ids[state.prefix_offset : state.read_offset])
        full = self._decode(token_ids[state.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            state.text += full[len(prefix) :]
            state.prefix_offset, state.read_offset = state.read_offset, len(token_ids)
        return state.text

    def finish(self, req_id: str, token_ids: list[int]) -> str:
        """Final text (flushing any held-back bytes) and forget the request."""
        state = self._states.pop(req_id, _TextState())
        prefix = self._decode(token_ids[state.prefix_offset : state.read_offset])
        return state.text + self._decode(token_ids[state.prefix_offset :])[len(prefix) :]

    def forget(self, req_id: str) -> None:
        self._states.pop(req_id, None)

    @staticmethod
    def find_stop(text: str, stops: list[str], start: int = 0) -> int | None:
        """Index where the earliest stop string starts at or after ``start``, or None."""
        hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
        return min(hits) if hits else None
