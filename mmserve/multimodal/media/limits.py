"""The size limits every media read obeys, and the errors for media over them (HTTP 413 at the
server)."""

from __future__ import annotations

MAX_IMAGE_BYTES = 20 << 20
MAX_VIDEO_BYTES = 128 << 20
MAX_IMAGE_PIXELS = 6000 * 6000


class MediaTooLargeError(ValueError):
    """An image or video exceeds a size limit (HTTP 413 at the server)."""


class ImageTooLargeError(MediaTooLargeError):
    """The image exceeds a byte or pixel limit (HTTP 413 at the server)."""


class VideoTooLargeError(MediaTooLargeError):
    """The video exceeds a byte, length, frame or time limit (HTTP 413 at the server)."""
