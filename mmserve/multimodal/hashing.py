"""Content hash of an image: the encoder cache's key, computed once at admission."""

from __future__ import annotations

import json
from typing import Any

import blake3
from PIL import Image


def _prefix(model_id: str, processor_kwargs: dict[str, Any]) -> bytes:
    kwargs = json.dumps(processor_kwargs, sort_keys=True, default=str)
    return f"{model_id}\0{kwargs}\0".encode()


def hash_image(
    image: Image.Image,
    model_id: str,
    processor_kwargs: dict[str, Any],
    pixels: bytes | None = None,
) -> str:
    """256-bit blake3 hex of model id + processor kwargs + mode + size + decoded pixels.
    ``pixels``: ``image.tobytes()`` when the caller already has it (saves a copy)."""
    hasher = blake3.blake3(_prefix(model_id, processor_kwargs))
    hasher.update(f"{image.mode}\0{image.size[0]}x{image.size[1]}\0".encode())
    hasher.update(image.tobytes() if pixels is None else pixels)
    return hasher.hexdigest()


def hash_uuid(
    uuid: str,
    model_id: str,
    processor_kwargs: dict[str, Any],
    num_embeddings: int,
    size: tuple[int, int] = (0, 0),
) -> str:
    """A caller's stable id used instead of the pixels (still scoped to model and kwargs). The
    embedding count and the image size are mixed in, so a uuid reused for an image of another
    size or token count is a different key (a miss), never another image's embeddings."""
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"image uuid must be a non-empty string, got {uuid!r}")
    hasher = blake3.blake3(_prefix(model_id, processor_kwargs))
    hasher.update(f"uuid\0{num_embeddings}\0{size[0]}x{size[1]}\0".encode() + uuid.encode())
    return hasher.hexdigest()


def multi_image_hash(mm_hash: str) -> str:
    """The key of an image prepared in its model's multi-image mode: the same pixels (or
    uuid) give other embeddings there than alone, so they get another key."""
    return blake3.blake3(f"multi-image\0{mm_hash}".encode()).hexdigest()


def salted(mm_hash: str, cache_salt: str | None) -> str:
    """The item's cache key within one tenant: ``cache_salt`` scopes it (None: shared)."""
    if cache_salt is None:
        return mm_hash
    return blake3.blake3(f"salt\0{cache_salt}\0{mm_hash}".encode()).hexdigest()
