"""Bookkeeping of the content-addressed encoder cache the worker holds (no tensors here)."""

from __future__ import annotations

from collections import OrderedDict


class EncoderCacheManager:
    """Which image embeddings the worker holds, keyed by ``MultiModalItem.key`` (content hash +
    embedding count), shared by requests.

    Invariants:
    - every cached key is in exactly one of ``referenced`` (key -> non-empty set of request
      ids) or ``unreferenced`` (LRU order, least recently released first);
    - ``num_free == capacity - sum(sizes of all cached keys)`` and never drops below 0;
    - only unreferenced entries are evicted, lazily, when an allocation needs their space;
    - every evicted key is reported by ``take_freed()`` so the worker can drop it (a key may be
      reported again after ``discard``; dropping is idempotent);
    - the key includes the embedding count, so a content-hash collision between items of
      different lengths is two entries (a miss), never an exception or a wrong splice;
    - with ``retain_unreferenced=False`` (cross-request caching off) an entry is evicted as soon
      as its last reference is released, so only images in use are held.
    """

    def __init__(
        self, capacity: int, bytes_per_embedding: int = 0, retain_unreferenced: bool = True
    ) -> None:
        if capacity < 0:
            raise ValueError(f"encoder cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.bytes_per_embedding = bytes_per_embedding
        self.retain_unreferenced = retain_unreferenced
        self.num_free = capacity
        self.sizes: dict[str, int] = {}
        self.referenced: dict[str, set[str]] = {}
        self.unreferenced: OrderedDict[str, None] = OrderedDict()
        self._num_evictable = 0
        self._freed: list[str] = []
        self.num_evictions = 0

    @property
    def num_cached_embeddings(self) -> int:
        return self.capacity - self.num_free

    @property
    def num_bytes(self) -> int:
        return self.num_cached_embeddings * self.bytes_per_embedding

    def contains(self, key: str) -> bool:
        return key in self.sizes

    def is_referenced_by(self, mm_hash: str, req_id: str) -> bool:
        return req_id in self.referenced.get(mm_hash, ())

    def add_ref(self, mm_hash: str, req_id: str) -> bool:
        """Reference a cached entry (reviving it from the LRU). True if the ref is new."""
        if mm_hash in self.unreferenced:
            del self.unreferenced[mm_hash]
            self._num_evictable -= self.sizes[mm_hash]
            self.referenced[mm_hash] = set()
        refs = self.referenced[mm_hash]
        if req_id in refs:
            return False
        refs.add(req_id)
        return True

    def can_allocate(self, num_embeddings: int) -> bool:
        """Whether ``num_embeddings`` fit after evicting every unreferenced entry if needed."""
        return num_embeddings <= self.num_free + self._num_evictable

    def allocate(self, mm_hash: str, req_id: str, num_embeddings: int) -> None:
        """Make room (evicting LRU unreferenced entries) and record ``mm_hash`` for ``req_id``."""
        if mm_hash in self.sizes:
            raise ValueError(f"encoder cache entry {mm_hash} already exists")
        if not self.can_allocate(num_embeddings):
            raise ValueError(
                f"encoder cache cannot fit {num_embeddings} embeddings"
                f" (free {self.num_free}, evictable {self._num_evictable})"
            )
        while self.num_free < num_embeddings:
            victim, _ = self.unreferenced.popitem(last=False)
            size = self.sizes.pop(victim)
            self._num_evictable -= size
            self.num_free += size
            self._freed.append(victim)
            self.num_evictions += 1
        self.sizes[mm_hash] = num_embeddings
        self.referenced[mm_hash] = {req_id}
        self.num_free -= num_embeddings

    def release(self, mm_hash: str, req_id: str) -> None:
        """Drop ``req_id``'s reference; the entry stays cached (LRU) once nobody holds it."""
        refs = self.referenced.get(mm_hash)
        if refs is None or req_id not in refs:
            return
        refs.discard(req_id)
        if refs:
            return
        del self.referenced[mm_hash]
        if self.retain_unreferenced:
            self.unreferenced[mm_hash] = None
            self._num_evictable += self.sizes[mm_hash]
        else:
            self.num_free += self.sizes.pop(mm_hash)
            self._freed.append(mm_hash)
            self.num_evictions += 1

    def release_all(self, req_id: str, keys: list[str]) -> None:
        for key in keys:
            self.release(key, req_id)

    def discard(self, key: str) -> None:
        """Forget an entry whose embeddings were never computed (a rolled-back allocation)."""
        refs = self.referenced.pop(key, None)
        if refs is None:
            return
        self.num_free += self.sizes.pop(key)
        self._freed.append(key)

    def take_freed(self) -> list[str]:
        """Hashes evicted since the last call; each is returned once."""
        freed, self._freed = self._freed, []
        return freed
