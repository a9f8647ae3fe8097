"""L2: local-disk tier (survives restarts): atomic writes, a byte cap, LRU eviction."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from mmserve.config import check_store_dir

SUFFIX = ".mmes"
STALE_TEMP_SECONDS = 3600.0


class DiskTier:
    """One file per store key under ``root/<first two hex digits>/``.

    Invariants: a value file is complete or absent (written to a temp file in ``root`` then
    ``os.replace``d; not fsynced: a file a crash truncated fails its MAC, a miss); the indexed
    bytes never exceed ``capacity`` after a ``put`` (least recently used files are deleted
    first); the index is rebuilt from the files at open, ordered by mtime, and a read refreshes
    the mtime, so the LRU order survives restarts; a missing or unreadable file is a miss
    (another process sharing the directory may have deleted it).
    """

    name = "disk"

    def __init__(self, root: str | Path, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"encoder store disk capacity must be >= 1 byte, got {capacity}")
        check_store_dir(root)  # the rule `mmserve` checks before loading
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. made a file since the check
            raise ValueError(f"encoder_store_dir {str(root)!r} is not usable: {exc}") from exc
        self.capacity = capacity
        self.num_bytes = 0
        self._index: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._load_index()

    def _load_index(self) -> None:
        found: list[tuple[float, str, int]] = []
        now = time.time()
        for entry in self.root.iterdir():
            if entry.name.startswith(".tmp-"):
                try:
                    if now - entry.stat().st_mtime > STALE_TEMP_SECONDS:
                        entry.unlink()
                except OSError:
                    pass
                continue
            if not entry.is_dir() or len(entry.name) != 2:
                continue
            for file in entry.iterdir():
                if file.suffix == SUFFIX:
                    try:
                        st = file.stat()
                    except OSError:
                        continue
                    found.append((st.st_mtime, file.stem, st.st_size))
        for _, key, size in sorted(found):
            self._index[key] = size
            self.num_bytes += size
        self._evict_over_capacity()

    def path_of(self, key: str) -> Path:
        return self.root / key[:2] / (key + SUFFIX)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        """Whether this process's index lists ``key`` (another process may have deleted it)."""
        with self._lock:
            return key in self._index

    def get(self, key: str) -> bytes | None:
        path = self.path_of(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._forget(key)
            return None
        try:
            os.utime(path)
        except OSError:  # evicted between the read and now: keep it out of the index
            self._forget(key)
            return data
        with self._lock:
            if key not in self._index:
                self.num_bytes += len(data)
            self._index[key] = len(data)
            self._index.move_to_end(key)
        return data

    def put(self, key: str, value: bytes) -> bool:
        """Whether the value was stored (False: larger than the whole tier)."""
        if len(value) > self.capacity:
            return False
        path = self.path_of(key)
        path.parent.mkdir(exist_ok=True)
        tmp = self.root / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            tmp.write_bytes(value)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        with self._lock:
            self.num_bytes += len(value) - self._index.pop(key, 0)
            self._index[key] = len(value)
            self._evict_over_capacity()
        return True

    def delete(self, key: str) -> None:
        try:
            self.path_of(key).unlink()
        except FileNotFoundError:
            pass
        self._forget(key)

    def _forget(self, key: str) -> None:
        with self._lock:
            self.num_bytes -= self._index.pop(key, 0)

    def _evict_over_capacity(self) -> None:
        """Caller holds the lock (or is the constructor)."""
        while self.num_bytes > self.capacity and self._index:
            victim, size = self._index.popitem(last=False)
            self.num_bytes -= size
            try:
                self.path_of(victim).unlink()
            except OSError:
                pass
