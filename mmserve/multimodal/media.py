"""Load an image from PIL / bytes / path / data URL / http(s) URL, with size limits, as RGB."""

from __future__ import annotations

import base64
import binascii
import io
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, UnidentifiedImageError

MAX_IMAGE_BYTES = 20 << 20
MAX_IMAGE_PIXELS = 6000 * 6000
HTTP_TIMEOUT_S = 10.0  # per connect / read
HTTP_TOTAL_TIMEOUT_S = 30.0  # whole download: a slow sender cannot hold an admission thread


class ImageTooLargeError(ValueError):
    """The image exceeds a byte or pixel limit (HTTP 413 at the server)."""


def load_image(source: Any, allowed_local_path: Path | None | bool = True) -> Image.Image:
    """Decode ``source`` into an RGB PIL image or raise ValueError saying what is wrong.

    ``allowed_local_path``: True allows any local file (offline API), a directory allows files
    below it only, None/False forbids local files (server default).
    """
    raw = read_image_source(source, allowed_local_path)
    return checked_image(raw) if isinstance(raw, Image.Image) else decode_image(raw)


def read_image_source(source: Any, allowed_local_path: Path | None | bool = True) -> Any:
    """The encoded bytes behind ``source`` (or the PIL image itself), size-capped, undecoded."""
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, Path):
        return _read_local(source, allowed_local_path)
    if not isinstance(source, str):
        raise ValueError(f"unsupported image input of type {type(source).__name__}")
    if source.startswith("data:"):
        return _data_url_bytes(source)
    if source.startswith(("http://", "https://")):
        return _fetch(source)
    if source.startswith("file://"):
        return _read_local(Path(source[len("file://") :]), allowed_local_path)
    if "://" in source:
        raise ValueError(f"unsupported image URL scheme in {source[:40]!r}")
    return _read_local(Path(source), allowed_local_path)


def _data_url_bytes(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise ValueError("image data URL must look like data:image/<type>;base64,<data>")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageTooLargeError(f"image data URL exceeds {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"invalid base64 in image data URL: {exc}") from None


def _fetch(url: str) -> bytes:
    try:
        with httpx.stream("GET", url, timeout=HTTP_TIMEOUT_S, follow_redirects=True) as resp:
            if resp.status_code != 200:
                raise ValueError(f"fetching image {url!r} returned HTTP {resp.status_code}")
            chunks, size = [], 0
            deadline = time.monotonic() + HTTP_TOTAL_TIMEOUT_S
            for chunk in resp.iter_bytes():
                if time.monotonic() > deadline:
                    raise ValueError(f"fetching image {url!r} took over {HTTP_TOTAL_TIMEOUT_S} s")
                size += len(chunk)
                if size > MAX_IMAGE_BYTES:
                    raise ImageTooLargeError(f"image at {url!r} exceeds {MAX_IMAGE_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.HTTPError as exc:
        raise ValueError(f"could not fetch image {url!r}: {exc}") from None


def _read_local(path: Path, allowed: Path | None | bool) -> bytes:
    if allowed is None or allowed is False:
        raise ValueError("local image paths are not allowed (see --allowed-local-media-path)")
    resolved = path.expanduser().resolve()
    if allowed is not True and not resolved.is_relative_to(Path(allowed).resolve()):
        raise ValueError(f"image path {str(path)!r} is outside the allowed media directory")
    if not resolved.is_file():
        raise ValueError(f"image file {str(path)!r} does not exist")
    if resolved.stat().st_size > MAX_IMAGE_BYTES:
        raise ImageTooLargeError(f"image file {str(path)!r} exceeds {MAX_IMAGE_BYTES} bytes")
    return resolved.read_bytes()


def decode_image(data: bytes) -> Image.Image:
    if not data:
        raise ValueError("image data is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageTooLargeError(f"image exceeds {MAX_IMAGE_BYTES} bytes")
    try:
        image = Image.open(io.BytesIO(data))
        _check_size(image)
        image.load()
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"image exceeds the pixel limit: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValueError(f"unreadable image: {exc}") from None
    return checked_image(image)


def _check_size(image: Image.Image) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise ValueError(f"image has zero size {width}x{height}")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageTooLargeError(
            f"image of {width}x{height} pixels exceeds the limit of {MAX_IMAGE_PIXELS} pixels"
        )


def checked_image(image: Image.Image) -> Image.Image:
    _check_size(image)
    return image if image.mode == "RGB" else image.convert("RGB")
