"""The admission memo of prepared images: the same encoded image bytes are decoded, hashed and
preprocessed once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mmserve.multimodal.memo import DEFAULT_MEMO_BYTES, ByteBoundedMemo


@dataclass(frozen=True)
class PreparedImage:
    """What admission derives from one image: content hash (of the pixels, whatever the
    mode), processor output, embedding count, the decoded size (width, height) and whether it
    was prepared in the model's multi-image mode (``ImagePreparer.multi_image``: the same pixels
    give other data, count and encoder-cache key there)."""

    mm_hash: str
    data: Any
    length: int
    size: tuple[int, int] = (0, 0)
    multi_image: bool = False


def _nbytes(data: Any) -> int:
    if isinstance(data, dict):
        return sum(_nbytes(v) for v in data.values())
    return int(np.asarray(data).nbytes) if hasattr(data, "__array__") else 64


class ProcessedImageMemo(ByteBoundedMemo[PreparedImage]):
    """``ByteBoundedMemo`` of ``PreparedImage``s, sized by their processor outputs."""

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        super().__init__(max_bytes, lambda prepared: _nbytes(prepared.data))
