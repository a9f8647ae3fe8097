"""Media handles: an image or a video encoded ahead (``/v1/mm/encode``, ``LLM.encode``) named
in a later prompt by ``mmserve://<handle>`` (an image by the ``uuid`` it was sent with, too)
instead of its bytes.

An image's handle is its encoder-cache key hash (``MultiModalItem.hash``): its content hash,
scoped to the tenant's ``cache_salt``. A video's is its content hash so scoped, which every
piece's item hash (frame group, frame) starts with (``handle_of``). Its ``HandleRecord`` keeps
what the processor needs to build the prompt without the pixels (placeholder count, image size,
multi-image mode and the processor output with its large arrays left out: Qwen2-VL's
``image_grid_thw``, LLaVA-OneVision's ``image_sizes``, Idefics3's tile layout stay; a video's
grid, frame count and times).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import blake3
import numpy as np

from mmserve.multimodal.hashing import salted
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.video.memo import AnyPreparedVideo
from mmserve.multimodal.video.onevision import PreparedOnevisionVideo
from mmserve.multimodal.video.prep import PreparedVideo
from mmserve.multimodal.video.smolvlm_prep import PreparedSmolVideo

SCHEME = "mmserve://"
RECORD_VERSION = 1  # an image's record; a video's is version 2 (readers of 1 refuse it)
VIDEO_RECORD_VERSION = 2
VIDEO_CLASSES = (PreparedVideo, PreparedOnevisionVideo, PreparedSmolVideo)
VIDEO_TYPES: dict[str, type[AnyPreparedVideo]] = {cls.__name__: cls for cls in VIDEO_CLASSES}
MediaKind = Literal["image", "video"]
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
    """An image or a video named by reference in a prompt: ``handle`` (from
    ``mmserve://<handle>``) or an image's ``uuid`` (vLLM's part ``uuid`` sent without data);
    exactly one is set."""

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


def handle_of(item_hash: str) -> str:
    """The handle an item's hash belongs to: an image's key less its crop (``#<crop>``), a
    video's less its piece (``.g<i>/<t>``, ``.f<i>/<n>``)."""
    return item_hash.split("#", 1)[0].split(".", 1)[0]


def media_kinds(content: Sequence[Any]) -> list[MediaKind]:
    """The kinds of a message's media parts, in content order."""
    kinds: list[MediaKind] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image_url", "image", "image_embeds"):
            kinds.append("image")
        elif kind in ("video_url", "video"):
            kinds.append("video")
    return kinds


def in_content_order(
    records: Sequence[HandleRecord], kinds: Sequence[MediaKind]
) -> list[HandleRecord]:
    """Records of an encode (images first, then videos, each in order) in content order."""
    images = iter([record for record in records if record.kind == "image"])
    videos = iter([record for record in records if record.kind == "video"])
    if len(kinds) != len(records) or sorted(kinds) != sorted(r.kind for r in records):
        return list(records)
    return [next(images) if kind == "image" else next(videos) for kind in kinds]


def uuid_alias(uuid: str, cache_salt: str | None) -> str:
    """The tenant-scoped name under which an image's ``uuid`` points to its handle."""
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"image uuid must be a non-empty string, got {uuid!r}")
    return salted(blake3.blake3(f"uuid-alias\0{uuid}".encode()).hexdigest(), cache_salt)


@dataclass(frozen=True)
class HandleRecord:
    """What a handle stands for, without the pixels.

    Invariants: ``media`` is the image (``PreparedImage``) or the video (a prepared video) as
    admission prepared it, its large arrays (every one over ``KEPT_ARRAY_BYTES``: the image's
    processor output, the video's ``pixel_values``) replaced by zero-stride arrays of the same
    shape and dtype (no memory; it must never be encoded). An image's ``mm_hash`` is the hash
    the item key is made of before the multi-image marking and the tenant's salt (for an image
    sent with a uuid: the uuid's hash), so ``InputProcessor.item_key(image, None, salt)`` equals
    ``handle`` exactly for the tenant that made it; a video's gives ``salted(mm_hash, salt) ==
    handle``, and each of its pieces' item hashes is the handle with the piece's suffix, so the
    record needs no list of keys. ``model`` and ``settings`` (the canonical image-processor
    kwargs, for a video the merged kwargs with its sampling; "" for the engine's) are those it
    was encoded with."""

    handle: str
    media: PreparedImage | AnyPreparedVideo
    model: str
    settings: str

    @classmethod
    def of(
        cls, handle: str, prepared: PreparedImage | AnyPreparedVideo, model: str, settings: str
    ) -> HandleRecord:
        if isinstance(prepared, PreparedImage):
            media: PreparedImage | AnyPreparedVideo = dataclasses.replace(
                prepared, data=_without_pixels(prepared.data)
            )
        else:
            media = dataclasses.replace(
                prepared, pixel_values=_without_pixels(prepared.pixel_values)
            )
        return cls(handle, media, model, settings)

    @property
    def kind(self) -> MediaKind:
        return "image" if isinstance(self.media, PreparedImage) else "video"

    @property
    def image(self) -> PreparedImage:
        """An image record's image (a video's record has none)."""
        if not isinstance(self.media, PreparedImage):
            raise ValueError(f"media handle {self.handle} is a video, not an image")
        return self.media

    @property
    def tokens(self) -> int:
        """The embeddings the media takes (a video's: all its pieces')."""
        media = self.media
        if isinstance(media, PreparedSmolVideo):
            return len(media.pixel_values) * media.frame_tokens
        return media.length

    @property
    def item(self) -> dict[str, Any]:
        """What the encode APIs answer for it."""
        return {"type": self.kind, "handle": self.handle, "tokens": self.tokens}

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"handle": self.handle, "model": self.model}
        body["settings"] = self.settings
        media = self.media
        if isinstance(media, PreparedImage):
            body |= {
                "version": RECORD_VERSION,
                "mm_hash": media.mm_hash,
                "length": media.length,
                "size": list(media.size),
                "multi_image": media.multi_image,
                "data": _encode_tree(media.data),
            }
        else:
            fields = {f.name: getattr(media, f.name) for f in dataclasses.fields(media)}
            video = {"type": type(media).__name__, "fields": _encode_tree(fields)}
            body |= {"version": VIDEO_RECORD_VERSION, "video": video}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> HandleRecord:
        """ValueError for anything but a record this version wrote."""
        body = json.loads(blob.decode())
        version = body.get("version")
        if version == VIDEO_RECORD_VERSION:
            video_cls = VIDEO_TYPES[body["video"]["type"]]
            media: PreparedImage | AnyPreparedVideo = video_cls(
                **_decode_tree(body["video"]["fields"])
            )
        elif version == RECORD_VERSION:
            width, height = body["size"]
            media = PreparedImage(
                str(body["mm_hash"]),
                _decode_tree(body["data"]),
                int(body["length"]),
                (int(width), int(height)),
                bool(body["multi_image"]),
            )
        else:
            raise ValueError(f"handle record version {version!r}")
        return cls(str(body["handle"]), media, str(body["model"]), str(body["settings"]))


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
