"""One ``.safetensors`` file read without the ``safetensors`` package's copies: its header,
tensors mapped copy-on-write as views of the file, and positioned reads into a destination.
Why mapping and reads are split this way is the loader's business
(``mmserve.models.checkpoint.loader``)."""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import mmap
import os
import struct
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


# The file mappings views were taken of, while any view lives: (first byte's address, length,
# the mapping). Weak, so that a mapping goes when its last view does.
_LIVE_MAPS: list[tuple[int, int, weakref.ref[mmap.mmap]]] = []


def _register(mapping: mmap.mmap) -> None:
    _LIVE_MAPS[:] = [entry for entry in _LIVE_MAPS if entry[2]() is not None]
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    _LIVE_MAPS.append((base, len(mapping), weakref.ref(mapping)))


def release_mapped_pages(tensor: torch.Tensor) -> int:
    """Take out of the resident set the pages of a checkpoint mapping that lie wholly inside
    ``tensor``'s bytes; returns how many bytes that was (0 for memory that is no mapping's).

    For a mapped weight nothing reads any more, e.g. one a packed copy replaced. Reading the
    view again still gives the file's values (the pages come back from the file), but a write
    to it made before is lost, so the caller must hold that nothing will read it. Pages shared
    with a neighbouring tensor stay, and so does a tensor that is not contiguous (its bytes
    are not one span)."""
    if not tensor.is_contiguous():
        return 0
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    for base, length, ref in _LIVE_MAPS:
        mapping = ref()
        if mapping is None or not base <= start < base + length:
            continue
        page = mmap.PAGESIZE
        first = -(-(start - base) // page) * page
        last = (min(end, base + length) - base) // page * page
        if last <= first:
            return 0
        mapping.madvise(mmap.MADV_DONTNEED, first, last - first)
        return last - first
    return 0


class SafetensorsFile:
    """One ``.safetensors`` file: its header's entries and reads of single tensors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 -- closed by __exit__
        (size,) = struct.unpack("<Q", self._file.read(8))
        header: dict[str, Any] = json.loads(self._file.read(size))
        header.pop("__metadata__", None)
        self.entries: dict[str, dict[str, Any]] = header
        self._data_start = 8 + size
        self._map: mmap.mmap | None = None
        data_bytes = max((e["data_offsets"][1] for e in header.values()), default=0)
        if self._data_start + data_bytes > os.fstat(self._file.fileno()).st_size:
            self._file.close()
            raise ValueError(f"{path} is truncated: its header lists {data_bytes} data bytes")

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._file.close()

    def keys(self) -> list[str]:
        """Tensor names in file order (sequential reads)."""
        return sorted(self.entries, key=lambda k: self.entries[k]["data_offsets"][0])

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def mapped(self, key: str) -> torch.Tensor | None:
        """Tensor ``key`` as a view of the file mapped copy-on-write (writes stay private), or
        None when it is empty or its data is not aligned to its element size. The view keeps
        the mapping alive after this file closes."""
        return self.mapped_run([key])

    def mapped_run(self, keys: Sequence[str]) -> torch.Tensor | None:
        """Tensors ``keys`` stacked along their first dimension, as one mapped view (as
        ``mapped``), when they share a dtype and trailing dimensions and lie back to back in
        the file in this order; else None."""
        spans = [self._span(key) for key in keys]
        shapes = [self.shape(key) for key in keys]
        dtype, shape = spans[0][0], shapes[0]
        if len(keys) > 1:
            if any(not dims or dims[1:] != shape[1:] for dims in shapes):
                return None
            if any(kind != dtype for kind, _, _ in spans):
                return None
            if any(later[1] != earlier[2] for earlier, later in itertools.pairwise(spans)):
                return None
            shape = (sum(dims[0] for dims in shapes), *shape[1:])
        start, end = spans[0][1], spans[-1][2]
        offset = self._data_start + start
        if end == start or offset % dtype.itemsize:
            return None
        if self._map is None:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
            _register(self._map)
        flat = torch.frombuffer(self._map, dtype=dtype, count=(end - start) // dtype.itemsize,
                                offset=offset)  # fmt: skip
        return flat.view(shape)

    def dtype(self, key: str) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.entries[key]["dtype"]]

    def _span(self, key: str) -> tuple[torch.dtype, int, int]:
        """Tensor ``key``'s dtype and data offsets; a ValueError naming the file when its
        header's offsets do not span its shape."""
        dtype, (start, end) = self.dtype(key), self.entries[key]["data_offsets"]
        expected = math.prod(self.shape(key)) * dtype.itemsize
        if end - start != expected:
            raise ValueError(f"{self.path}: tensor {key!r} has {end - start} bytes, its shape"
                             f" {self.shape(key)} takes {expected}")  # fmt: skip
        return dtype, start, end

    def read_into(self, key: str, dest: torch.Tensor) -> None:
        """Fill ``dest`` (the tensor's shape) with tensor ``key``, cast to ``dest``'s dtype."""
        dtype, start, end = self._span(key)
        if dest.numel() != math.prod(self.shape(key)):
            raise ValueError(f"{self.path}: tensor {key!r} has shape {self.shape(key)}, the"
                             f" destination {tuple(dest.shape)}")  # fmt: skip
        direct = dest.device.type == "cpu" and dest.dtype == dtype and dest.is_contiguous()
        target = dest if direct else torch.empty(dest.shape, dtype=dtype)
        if target.numel():
            self._readinto(start, target.reshape(-1).view(torch.uint8).numpy())
        if not direct:
            dest.copy_(target)

    def _readinto(self, offset: int, buffer: Any) -> None:
        """Positioned reads (no shared file offset), so threads may read one file at once."""
        view = memoryview(buffer).cast("B")
        start, done, fd = self._data_start + offset, 0, self._file.fileno()
        while done < len(view):
            count = os.preadv(fd, [view[done:]], start + done)
            if not count:
                raise ValueError(f"{self.path} is truncated")
            done += count
