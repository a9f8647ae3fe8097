"""Placeholder tokens in a prompt's token ids: where they are, and the ids with each one
replaced by its expansion (the image's or video's placeholder run)."""

from __future__ import annotations

import numpy as np


def placeholder_places(ids: np.ndarray, token: int | None, count: int, kind: str) -> np.ndarray:
    """Indices of ``token`` in ``ids``; ValueError unless there is one per given item."""
    places = np.flatnonzero(ids == token) if token is not None else np.empty(0, np.int64)
    if len(places) != count:
        raise ValueError(
            f"prompt has {len(places)} {kind} placeholder(s) but {count} {kind}(s) were given"
        )
    return places


def spliced(ids: np.ndarray, places: list[int], expansions: list[np.ndarray]) -> list[int]:
    """``ids`` with the token at each of the (ascending) ``places`` replaced by its expansion."""
    starts, ends = [0, *(p + 1 for p in places)], [*places, len(ids)]
    parts: list[np.ndarray] = []
    for start, end, expansion in zip(starts, ends, [*expansions, ids[:0]], strict=True):
        parts += [ids[start:end], expansion]
    return np.concatenate(parts).tolist()
