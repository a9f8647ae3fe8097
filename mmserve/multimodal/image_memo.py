"""Admission-side memo: the same encoded image bytes are decoded, hashed and preprocessed once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_MEMO_BYTES = 256 << 20


@dataclass(frozen=True)
class PreparedImage:
    """What admission derives from one image: content hash, processor output, embedding count
    and the decoded size (width, height)."""

    mm_hash: str
    data: Any
    length: int
    size: tuple[int, int] = (0, 0)


def _nbytes(data: Any) -> int:
    if isinstance(data, dict):
        return sum(_nbytes(v) for v in data.values())
    return int(np.asarray(data).nbytes) if hasattr(data, "__array__") else 64


class ProcessedImageMemo:
    """LRU of PreparedImage keyed by the blake3 of the encoded bytes (or the content hash).

    Invariants: the summed size of held processor outputs stays <= ``max_bytes`` (the least
    recently used entries go first); keys are only valid for one engine (model id and processor
    kwargs are fixed there); safe to use from several admission threads at once.
    """

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[PreparedImage, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: str) -> PreparedImage | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: str, prepared: PreparedImage) -> None:
        size = _nbytes(prepared.data)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (prepared, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
