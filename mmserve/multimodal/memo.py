"""``ByteBoundedMemo``: the admission memos' LRU (images in ``image.memo``, videos in
``video.memo``), so the same encoded media bytes are decoded, hashed and preprocessed once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

DEFAULT_MEMO_BYTES = 256 << 20
V = TypeVar("V")


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
