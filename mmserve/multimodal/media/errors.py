"""How a failed media read is reported: one uniform ``MediaFetchError`` message per media kind
for the client, the real reason in the server log only; size limits have errors of their own."""

from __future__ import annotations

import logging

from mmserve.multimodal.media.limits import (
    ImageTooLargeError,
    MediaTooLargeError,
    VideoTooLargeError,
)
from mmserve.multimodal.media.policy import MediaKind

# the fetcher's logger name, which server log filters already select
logger = logging.getLogger("mmserve.multimodal.media.fetch")


class MediaFetchError(ValueError):
    """A media source could not be loaded; ``str(exc)`` is the client-facing message.

    Invariant: the message never says why a fetch failed (refused address, DNS, connection,
    status...), so the server is no port scanner; the reason is only logged.
    """


class FetchRefused(Exception):
    """Internal: a fetch failed for the logged reason ``str(exc)``; never reaches a client."""


def shown_source(source: str) -> str:
    """``source`` shortened for a client-facing message."""
    return source if len(source) <= 120 else source[:117] + "..."


def fetch_failure(
    source: str, reason: str | Exception, local: bool = False, kind: MediaKind = "image"
) -> MediaFetchError:
    """Log the real reason; return the uniform client-facing error."""
    if isinstance(reason, Exception) and not isinstance(reason, FetchRefused):
        reason = f"{type(reason).__name__}: {reason}"
    logger.warning("media fetch of %r failed: %s", source[:2000], reason)
    what = f"could not read local {kind}" if local else f"could not fetch {kind} from"
    return MediaFetchError(f"{what} {shown_source(source)}")


def too_large(kind: MediaKind, message: str) -> MediaTooLargeError:
    """The size-limit error of ``kind``, its message prefixed with the kind."""
    return (VideoTooLargeError if kind == "video" else ImageTooLargeError)(f"{kind} {message}")
