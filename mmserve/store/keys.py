"""Store keys: what an encoder output depends on, hashed into one full-length key."""

from __future__ import annotations

import blake3

STORE_FORMAT_VERSION = 1


class StoreKeyer:
    """Maps an encoder-cache item key to its store key.

    Invariants: a store key is the full 256-bit blake3 (hex) of labelled fields: the store
    format version, the model weights fingerprint (not the path), the dtype, then the item key
    (``MultiModalItem.key``: the tenant-salted content hash, which already covers the model
    name, the processor kwargs and the pixels, plus the embedding count). Changing any field
    changes the key, so two model versions, dtypes or tenants never read each other's entries.
    """

    def __init__(self, fingerprint: str, dtype: str) -> None:
        for name, value in (("fingerprint", fingerprint), ("dtype", dtype)):
            if not value or "\0" in value:
                raise ValueError(f"store key {name} must be a non-empty string, got {value!r}")
        self.fingerprint = fingerprint
        self.dtype = dtype
        self._prefix = (
            f"mmserve-encoder-store\0version={STORE_FORMAT_VERSION}\0weights={fingerprint}"
            f"\0dtype={dtype}\0item="
        ).encode()

    def key(self, item_key: str) -> str:
        hasher = blake3.blake3(self._prefix)
        hasher.update(item_key.encode())
        return hasher.hexdigest()
