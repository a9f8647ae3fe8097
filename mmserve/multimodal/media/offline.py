"""Media read without the network: base64 data URLs and the local files a ``MediaFetchPolicy``
allows, size-capped; failures reported as ``media.errors`` says."""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mmserve.multimodal.media.errors import (
    FetchRefused,
    MediaFetchError,
    fetch_failure,
    shown_source,
    too_large,
)
from mmserve.multimodal.media.limits import MediaTooLargeError
from mmserve.multimodal.media.policy import MediaFetchPolicy, MediaKind


class OfflineMediaReader:
    """Reads data URLs and policy-allowed local files (blocking, never the network).

    Invariants: a data URL is refused on its length before anything is decoded; a local file
    is read only when its resolved path (symlinks followed first) is inside the allowed
    directory, and only if it is a regular file; at most the limit plus one byte is read.
    """

    def __init__(self, policy: MediaFetchPolicy) -> None:
        self.policy = policy

    def read(self, source: str, kind: MediaKind = "image") -> bytes:
        """A data URL or an allowed local path / file:// URL."""
        if source[:5].lower() == "data:":
            return self._data_url_bytes(source, kind)
        scheme = source.partition("://")[0].lower() if "://" in source else ""
        if scheme not in ("", "file") or self.policy.allowed_local_path in (None, False):
            raise fetch_failure(source, f"scheme {scheme!r} or local files not allowed", kind=kind)
        return self._read_local(source, scheme == "file", kind)

    def _data_url_bytes(self, url: str, kind: MediaKind) -> bytes:
        limit = self.policy.byte_limit(kind, data_url=True)
        header, sep, payload = url.partition(",")
        if not sep or not header.lower().endswith(";base64"):
            raise MediaFetchError(f"{kind} data URL must look like data:<mime>;base64,<data>")
        if len(payload) > 4 * -(-limit // 3):  # before decoding anything
            raise too_large(kind, f"data URL exceeds {limit} bytes")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaFetchError(f"invalid base64 in {kind} data URL") from None
        if len(data) > limit:
            raise too_large(kind, f"data URL exceeds {limit} bytes")
        return data

    def _read_local(self, source: str, is_url: bool, kind: MediaKind) -> bytes:
        """A local file allowed by the policy; one message for every failure."""
        allowed, limit = self.policy.allowed_local_path, self.policy.byte_limit(kind)
        too_large_error = too_large(kind, f"at {shown_source(source)} exceeds {limit} bytes")
        try:
            if is_url:
                parts = urlsplit(source)
                if parts.netloc not in ("", "localhost"):
                    raise FetchRefused(f"file URL with host {parts.netloc!r}")
                path = Path(unquote(parts.path))
            else:
                path = Path(source).expanduser()
            resolved = path.resolve()  # symlinks resolved before the directory check
            if isinstance(allowed, Path) and not resolved.is_relative_to(allowed.resolve()):
                raise FetchRefused("outside the allowed media directory")
            # O_NONBLOCK: a FIFO cannot hang us; O_NOFOLLOW: no symlink swapped in since
            fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise FetchRefused("not a regular file")
                if info.st_size > limit:
                    raise too_large_error
                data = f.read(limit + 1)
        except MediaTooLargeError:
            raise
        except (FetchRefused, OSError, ValueError, RuntimeError) as exc:
            raise fetch_failure(source, exc, local=True, kind=kind) from None
        if len(data) > limit:
            raise too_large_error
        return data
