"""Small records beside the embeddings in the disk and Redis tiers (media-handle metadata), so
a handle made on one replica resolves on every replica sharing the store."""

from __future__ import annotations

import logging

from mmserve.store.codec import CorruptEntry
from mmserve.store.store import EncoderStore

logger = logging.getLogger(__name__)

MAGIC = b"MMER\x01"


class StoreRecords:
    """Named byte records in an ``EncoderStore``'s byte tiers (not L1: the caller keeps its own
    in-process copy).

    Invariants: a record's store key is the store's keyer over ``record\\0<name>`` (weights
    fingerprint and dtype included, and no item key contains a NUL), so a record is seen only by
    engines that would accept the embeddings beside it; values are sealed with the store's MAC
    bound to that key, and one that fails to verify is a miss (deleted, counted); writes go
    through the store's write-behind queue, after any embedding written before them; a tier
    failure is a miss, never an error.
    """

    def __init__(self, store: EncoderStore) -> None:
        self.store = store

    def _key(self, name: str) -> str:
        return self.store.keyer.key(f"record\0{name}")

    def put(self, name: str, body: bytes) -> None:
        """Queue the record's write to every byte tier (never blocks)."""
        store, skey = self.store, self._key(name)
        if not store.tiers:
            return
        blob = store.codec.seal(skey, body, MAGIC)

        def write() -> None:
            for tier in store.tiers:
                try:
                    tier.put(skey, blob)
                except Exception as exc:
                    store.metrics.add(f"{tier.name}_errors")
                    logger.debug("encoder store: record write to %s failed: %s", tier.name, exc)

        store.writer.submit(write)

    def get(self, name: str) -> bytes | None:
        """The record from the first tier that holds a valid one (blocking: tier reads)."""
        store, skey = self.store, self._key(name)
        for tier in store.tiers:
            try:
                blob = tier.get(skey)
            except Exception:
                store.metrics.add(f"{tier.name}_errors")
                continue
            if blob is None:
                continue
            try:
                return store.codec.unseal(skey, blob, MAGIC)
            except CorruptEntry:
                store.metrics.add("corrupt_entries")
                try:
                    tier.delete(skey)
                except Exception:
                    store.metrics.add(f"{tier.name}_errors")
        return None
