"""Decode an image from PIL / bytes / path / data URL / http(s) URL, with size limits, as RGB.

Reading URLs and files is the ``MediaFetcher``'s job (``media.fetch``), which the caller
passes: its policy decides what may be read."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, UnidentifiedImageError

from mmserve.multimodal.media.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageTooLargeError

if TYPE_CHECKING:
    from mmserve.multimodal.media.fetch import MediaFetcher


def load_image(source: Any, fetcher: MediaFetcher) -> Image.Image:
    """Decode ``source`` into an RGB PIL image or raise ValueError saying what is wrong.
    ``fetcher`` applies its policy to URLs and paths."""
    raw = read_image_source(source, fetcher)
    return checked_image(raw) if isinstance(raw, Image.Image) else decode_image(raw)


def read_image_source(source: Any, fetcher: MediaFetcher) -> Any:
    """The encoded bytes behind ``source`` (or the PIL image itself), size-capped, undecoded.
    Strings (data: / http(s) / file:// URLs, paths) and ``Path``s go through ``fetcher``."""
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, Path):
        source = str(source)
    if not isinstance(source, str):
        raise ValueError(f"unsupported image input of type {type(source).__name__}")
    return fetcher.load_blocking(source)


def decode_image(data: bytes) -> Image.Image:
    if not data:
        raise ValueError("image data is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageTooLargeError(f"image exceeds {MAX_IMAGE_BYTES} bytes")
    try:
        image = Image.open(io.BytesIO(data))
        _check_size(image)
        image.load()
    except Image.DecompressionBombError:
        raise ImageTooLargeError(f"image exceeds the limit of {MAX_IMAGE_PIXELS} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError):
        raise ValueError("could not decode the image (corrupt or not a supported format)") from None
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
