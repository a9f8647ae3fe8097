"""Admission-side memos: the same encoded image (or video) bytes are decoded, hashed and
preprocessed once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

DEFAULT_MEMO_BYTES = 256 << 20
V = TypeVar("V")


@dataclass(frozen=True)
class PreparedImage:
    """What admission derives from one image: content hash (of the pixels, whatever the
    mode), processor output, embedding count, the decoded size (width, height) and whether it
    was prepared in the model's multi-image mode (``ImagePreparer.multi_image``: the same pixels
    give other data, count and encoder-cache key there)."""

    mm_hash: str
    data: Any
    length: int
    size: tuple[int, int] = (0, 0)
    multi_image: bool = False


def _nbytes(data: Any) -> int:
    if isinstance(data, dict):
        return sum(_nbytes(v) for v in data.values())
    return int(np.asarray(data).nbytes) if hasattr(data, "__array__") else 64


class ByteBoundedMemo(Generic[V]):
    """LRU of values keyed by the blake3 of encoded media bytes (or a content hash).

    Invariants: the summed ``size_of`` of held values stays <= ``max_bytes`` (the least
    recently used entries go first); keys are only valid for one engine (model id and processor
    kwargs are fixed there); safe to use from several admission threads at once.
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self.size_of = size_of
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: str) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: str, prepared: V) -> None:
        size = self.size_of(prepared)
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


class ProcessedImageMemo(ByteBoundedMemo[PreparedImage]):
    """``ByteBoundedMemo`` of ``PreparedImage``s, sized by their processor outputs."""

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        super().__init__(max_bytes, lambda prepared: _nbytes(prepared.data))
