"""Chained KV block hashes whose extra keys say which image sits where in the block."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np
import xxhash

from mmserve.request import Request

ImageKey = tuple[str, int]  # (image key: hash + length, image start relative to the block start)

HASH_FUNCTIONS: dict[str, Callable[[bytes], bytes]] = {
    "sha256": lambda data: hashlib.sha256(data).digest(),
    "xxh3_128": xxhash.xxh3_128_digest,
}


def block_image_keys(request: Request, start: int, end: int) -> tuple[ImageKey, ...]:
    """(hash, offset - start) for every image of ``request`` overlapping [start, end)."""
    return tuple(
        (item.key, item.offset - start)
        for item in request.mm_items
        if item.offset < end and item.end > start
    )


class BlockHasher:
    """H(parent hash, block token ids, labelled extra keys) for every full block.

    Invariants: the first block's parent is a root seeded per process (random) or from the
    configured seed, so hashes are never shared across processes by accident; image keys and the
    cache salt are serialized under distinct labels so one kind of key cannot collide with the
    other; a request's hashes are computed once per full block and only appended to.
    """

    def __init__(self, algo: str = "xxh3_128", seed: int | None = None) -> None:
        if algo not in HASH_FUNCTIONS:
            raise ValueError(
                f"prefix_caching_hash_algo must be one of {sorted(HASH_FUNCTIONS)}, got {algo!r}"
            )
        self._hash = HASH_FUNCTIONS[algo]
        seed_bytes = os.urandom(16) if seed is None else str(seed).encode()
        self.root = self._hash(b"mmserve-root\0" + seed_bytes)
        self.num_hashed_blocks = 0

    def hash_block(
        self,
        parent: bytes,
        token_ids: np.ndarray | list[int],
        image_keys: tuple[ImageKey, ...] = (),
        salt: str | None = None,
    ) -> bytes:
        self.num_hashed_blocks += 1
        parts = [parent, b"\0tok\0", np.asarray(token_ids, dtype=np.int64).tobytes()]
        for mm_hash, offset in image_keys:
            parts.append(f"\0img\0{mm_hash}\0{offset}".encode())
        if salt is not None:
            parts.append(b"\0salt\0" + salt.encode())
        return self._hash(b"".join(parts))

    def extend(self, request: Request, block_size: int) -> None:
        """Append the hashes of ``request``'s full blocks that have none yet."""
        hashes = request.block_hashes
        first, num_full = len(hashes), request.num_tokens // block_size
        if first >= num_full:
            return
        tokens = np.asarray(
            request.all_token_ids[first * block_size : num_full * block_size], dtype=np.int64
        ).reshape(-1, block_size)
        parent = hashes[-1] if hashes else self.root
        for row, block_tokens in enumerate(tokens):
            start = (first + row) * block_size
            salt = request.cache_salt if start == 0 else None
            keys = block_image_keys(request, start, start + block_size)
            parent = self.hash_block(parent, block_tokens, keys, salt)
            hashes.append(parent)
