"""Media handles: an image encoded ahead (``/v1/mm/encode``, ``LLM.encode``) named in a later
prompt by ``mmserve://<handle>`` (or by the ``uuid`` it was sent with) instead of its bytes.

A handle is the image's encoder-cache key hash (``MultiModalItem.hash``): its content hash,
scoped to the tenant's ``cache_salt``. Its ``HandleRecord`` keeps what the processor needs to
build the prompt without the pixels (placeholder count, image size, multi-image mode and the
processor output with its large arrays left out: Qwen2-VL's ``image_grid_thw``, LLaVA-
OneVision's ``image_sizes``, Idefics3's tile layout stay).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np

from mmserve.multimodal.hashing import salted
from mmserve.multimodal.image.memo import PreparedImage

SCHEME = "mmserve://"
RECORD_VERSION = 1
_HANDLE = re.compile(r"[0-9a-f]{64}")
KEPT_ARRAY_BYTES = 4096  # processor-output arrays up to this size are kept, larger ones blanked


class MediaHandleError(ValueError):
    """A handle or uuid that cannot be used (HTTP 400 with ``code``): malformed, unknown to this
    model and tenant, expired (its embedding is gone from every tier), or made for other
    settings. The message always tells the client what to send instead."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[MediaHandleError], tuple[str, str]]:
        """Pickled with its code (a Ray replica's error reaches the ingress so)."""
        return type(self), (str(self), self.code)


@dataclass(frozen=True)
class MediaHandle:
    """An image named by reference in a prompt: ``handle`` (from ``mmserve://<handle>``) or
    ``uuid`` (vLLM's part ``uuid`` sent without data); exactly one is set."""

    handle: str | None = None
    uuid: str | None = None

    @property
    def label(self) -> str:
        return f"media handle {self.handle}" if self.handle else f"image uuid {self.uuid!r}"


def is_handle(source: Any) -> bool:
    """Whether an image source names a handle (resolved by the engine, never fetched)."""
    return isinstance(source, MediaHandle) or (
        isinstance(source, str) and source[: len(SCHEME)].lower() == SCHEME
    )


def as_handle(source: Any) -> MediaHandle:
    """``mmserve://<handle>`` or a ``MediaHandle`` -> a checked ``MediaHandle``."""
    if isinstance(source, MediaHandle):
        if source.handle is not None:
            return as_handle(SCHEME + source.handle)
        return source
    text = str(source)[len(SCHEME) :]
    if not _HANDLE.fullmatch(text):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise MediaHandleError(
            f"malformed media handle {shown!r}: a handle is 64 lowercase hex digits, as"
            " /v1/mm/encode returned it (mmserve://<handle>)",
            "media_handle_malformed",
        )
    return MediaHandle(handle=text)


def uuid_alias(uuid: str, cache_salt: str | None) -> str:
    """The tenant-scoped name under which an image's ``uuid`` points to its handle."""
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"image uuid must be a non-empty string, got {uuid!r}")
    return salted(blake3.blake3(f"uuid-alias\0{uuid}".encode()).hexdigest(), cache_salt)


@dataclass(frozen=True)
class HandleRecord:
    """What a handle stands for, without the pixels.

    Invariants: ``image`` is the image as admission prepared it, its ``mm_hash`` the hash the
    item key is made of before the multi-image marking and the tenant's salt (for an image sent
    with a uuid: the uuid's hash), so ``InputProcessor.item_key(image, None, salt)`` equals
    ``handle`` exactly for the tenant that made it; its ``data`` is the processor output with
    every array over ``KEPT_ARRAY_BYTES`` replaced by a zero-stride array of the same shape
    and dtype (no memory; it must never be encoded). ``model`` and ``settings`` (the canonical
    image-processor kwargs, "" for the engine's) are those it was encoded with."""

    handle: str
    image: PreparedImage
    model: str
    settings: str

    @classmethod
    def of(cls, handle: str, prepared: PreparedImage, model: str, settings: str) -> HandleRecord:
        image = PreparedImage(
            prepared.mm_hash,
            _without_pixels(prepared.data),
            prepared.length,
            prepared.size,
            prepared.multi_image,
        )
        return cls(handle, image, model, settings)

    @property
    def item(self) -> dict[str, Any]:
        """What the encode APIs answer for it."""
        return {"type": "image", "handle": self.handle, "tokens": self.image.length}

    def to_bytes(self) -> bytes:
        image = self.image
        body = {
            "version": RECORD_VERSION,
            "handle": self.handle,
            "mm_hash": image.mm_hash,
            "length": image.length,
            "size": list(image.size),
            "multi_image": image.multi_image,
            "model": self.model,
            "settings": self.settings,
            "data": _encode_tree(image.data),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> HandleRecord:
        """ValueError for anything but a record this version wrote."""
        body = json.loads(blob.decode())
        if body.get("version") != RECORD_VERSION:
            raise ValueError(f"handle record version {body.get('version')!r}")
        width, height = body["size"]
        image = PreparedImage(
            str(body["mm_hash"]),
            _decode_tree(body["data"]),
            int(body["length"]),
            (int(width), int(height)),
            bool(body["multi_image"]),
        )
        return cls(str(body["handle"]), image, str(body["model"]), str(body["settings"]))


def _without_pixels(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_pixels(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_without_pixels(v) for v in data)
    if hasattr(data, "__array__") and not isinstance(data, np.generic):
        array = np.asarray(data)
        if array.nbytes > KEPT_ARRAY_BYTES:
            return np.broadcast_to(np.zeros((), array.dtype), array.shape)
        return array
    return data


def _is_blank(array: np.ndarray) -> bool:
    return array.size > 1 and all(s == 0 for s in array.strides)


def _encode_tree(data: Any) -> Any:
    if isinstance(data, dict):
        return {"dict": {str(k): _encode_tree(v) for k, v in data.items()}}
    if isinstance(data, (list, tuple)):
        return {"list": [_encode_tree(v) for v in data], "tuple": isinstance(data, tuple)}
    if isinstance(data, np.ndarray):
        if _is_blank(data):
            return {"blank": list(data.shape), "dtype": data.dtype.str}
        raw = base64.b64encode(np.ascontiguousarray(data).tobytes()).decode()
        return {"array": raw, "shape": list(data.shape), "dtype": data.dtype.str}
    if isinstance(data, np.generic):
        data = data.item()
    if data is None or isinstance(data, (bool, int, float, str)):
        return {"value": data}
    raise ValueError(f"cannot keep processor output of type {type(data).__name__} in a handle")


def _decode_tree(node: Any) -> Any:
    if "dict" in node:
        return {k: _decode_tree(v) for k, v in node["dict"].items()}
    if "list" in node:
        values = [_decode_tree(v) for v in node["list"]]
        return tuple(values) if node.get("tuple") else values
    if "blank" in node:
        return np.broadcast_to(np.zeros((), np.dtype(node["dtype"])), tuple(node["blank"]))
    if "array" in node:
        raw = base64.b64decode(node["array"])
        return np.frombuffer(raw, np.dtype(node["dtype"])).reshape(node["shape"]).copy()
    return node["value"]
