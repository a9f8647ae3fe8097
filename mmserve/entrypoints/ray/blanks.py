"""Media-handle items cross Ray without their blanked arrays' bytes (shape and dtype only)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmserve.inputs import ProcessedPrompt


@dataclass(frozen=True)
class Blank:
    """A zero-stride array of zeros (``HandleRecord``'s stand-in for pixels) by shape and
    dtype: pickled as is, a blanked array is written out in full."""

    shape: tuple[int, ...]
    dtype: str
    torch: bool

    def restore(self) -> Any:
        if self.torch:
            return torch.zeros((), dtype=getattr(torch, self.dtype)).expand(self.shape)
        return np.broadcast_to(np.zeros((), np.dtype(self.dtype)), self.shape)


def _is_blank(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.size > 1 and not any(value.strides)
    if isinstance(value, torch.Tensor):
        return value.numel() > 1 and not any(value.stride())
    return False


def _map(data: Any, fn: Any) -> Any:
    if isinstance(data, dict):
        return {k: _map(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_map(v, fn) for v in data)
    return fn(data)


def _pack(value: Any) -> Any:
    if not _is_blank(value):
        return value
    if isinstance(value, torch.Tensor):
        return Blank(tuple(value.shape), str(value.dtype).removeprefix("torch."), True)
    return Blank(tuple(value.shape), value.dtype.str, False)


def _unpack(value: Any) -> Any:
    return value.restore() if isinstance(value, Blank) else value


def pack_blanks(processed: ProcessedPrompt) -> ProcessedPrompt:
    """A copy whose media-handle items hold ``Blank``s for their blanked arrays (the ingress,
    before it sends the prompt); other items and ``processed`` are left as they are."""
    if not any(item.by_handle for item in processed.mm_items):
        return processed
    items = [
        dataclasses.replace(item, data=_map(item.data, _pack)) if item.by_handle else item
        for item in processed.mm_items
    ]
    return dataclasses.replace(processed, mm_items=items)


def unpack_blanks(processed: ProcessedPrompt) -> None:
    """Restore the blanked arrays ``pack_blanks`` replaced (the replica, on arrival)."""
    for i, item in enumerate(processed.mm_items):
        if item.by_handle:
            processed.mm_items[i] = dataclasses.replace(item, data=_map(item.data, _unpack))
