"""Random weights for the real-size shapes, streamed to sharded safetensors files.

Drawing ~N(0, std) per element costs ~40 ns each on this CPU (90 s for 2B parameters), so a
tensor's values are instead windows of one pool of ``POOL_SIZE`` normal draws: each tensor
starts at its own offset (a hash of its name) and steps through the pool in chunks. Values are
deterministic per name and the bytes go from the pool straight to the file: building never
holds more than one small tensor plus the pool in memory, whatever the model size.
Matrices and embeddings get std ``WEIGHT_STD``; 1-D norm weights are 1, other 1-D tensors
(biases, CLIP's class embedding, LLaVA-OneVision's ``image_newline``) get std ``BIAS_STD``.

Files follow the safetensors format: an 8-byte little-endian header length, a JSON header
(``__metadata__`` ``{"format": "pt"}`` and per tensor its dtype, shape and ``data_offsets``)
padded with spaces to a multiple of 8 bytes, then the tensors back to back, in header order.
Within a file the tensors are ordered as ``safetensors.save_file`` (which writes the hub's
files) orders them: by dtype, widest first, then by name. Which tensors lie back to back
decides what the loader can map (a stacked gate/up weight, when its parts are adjacent), so
the shapes must not be laid out more favourably than a real checkpoint.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO

import torch

from ..build_steps import write_json

POOL_SIZE = (1 << 22) + 17  # draws; odd so that rows of power-of-two width do not repeat
CHUNK = 1 << 20  # elements copied per step
WEIGHT_STD = 0.02
BIAS_STD = 0.02
SEED = 20240601
DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
# safetensors' dtype order (its Rust ``Dtype`` enum), sorted descending when it writes a file
DTYPE_ORDER = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its published name, shape, dtype and how it is filled."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: str  # "normal", "small" or "ones"

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


@cache
def _pool(dtype: torch.dtype, std: float) -> torch.Tensor:
    """``2 * POOL_SIZE`` normal draws of ``std`` (the pool twice: any window is contiguous)."""
    gen = torch.Generator().manual_seed(SEED)
    pool = (torch.randn(POOL_SIZE, generator=gen) * std).to(dtype)
    return torch.cat([pool, pool])


def tensor_chunks(plan: TensorPlan) -> Iterator[torch.Tensor]:
    """The tensor's values, flat, in chunks of at most ``CHUNK`` elements."""
    total = plan.nbytes // plan.dtype.itemsize
    if plan.fill == "ones":
        yield torch.ones(total, dtype=plan.dtype)
        return
    pool = _pool(plan.dtype, WEIGHT_STD if plan.fill == "normal" else BIAS_STD)
    offset = zlib.crc32(plan.name.encode()) % POOL_SIZE
    step = 1 + (zlib.adler32(plan.name.encode()) % 4093)  # varies rows beyond the pool period
    for start in range(0, total, CHUNK):
        size = min(CHUNK, total - start)
        yield pool[offset : offset + size]
        offset = (offset + size + step) % POOL_SIZE


def file_order(plans: Iterable[TensorPlan]) -> list[TensorPlan]:
    """``plans`` in the order ``safetensors.save_file`` writes them."""
    return sorted(plans, key=lambda plan: (-DTYPE_ORDER[plan.dtype], plan.name))


def _header(plans: list[TensorPlan]) -> bytes:
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    start = 0
    for plan in plans:
        end = start + plan.nbytes
        entries[plan.name] = {"dtype": DTYPE_NAMES[plan.dtype], "shape": list(plan.shape),
                              "data_offsets": [start, end]}  # fmt: skip
        start = end
    header = json.dumps(entries, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8)


def write_safetensors(path: Path, plans: list[TensorPlan]) -> None:
    """Write ``plans`` as one safetensors file (in ``file_order``), streaming each tensor's
    chunks."""
    plans = file_order(plans)
    header = _header(plans)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for plan in plans:
            _write_tensor(f, plan)


def _write_tensor(f: BinaryIO, plan: TensorPlan) -> None:
    for chunk in tensor_chunks(plan):
        f.write(chunk.contiguous().view(torch.uint8).numpy().data)


def split_shards(plans: Iterable[TensorPlan], max_shard_bytes: int) -> list[list[TensorPlan]]:
    """Consecutive groups of at most ``max_shard_bytes`` (a bigger tensor gets its own shard),
    as transformers' ``save_pretrained`` splits."""
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for plan in plans:
        if shards[-1] and size + plan.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(plan)
        size += plan.nbytes
    return shards


def write_checkpoint(out: Path, plans: list[TensorPlan], max_shard_bytes: int) -> list[Path]:
    """``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` shards plus
    ``model.safetensors.index.json`` (``metadata.total_size`` in bytes and the ``weight_map``
    from each name to its file) when the tensors exceed one shard. Returns the files written."""
    shards = split_shards(plans, max_shard_bytes)
    if len(shards) == 1:
        write_safetensors(out / "model.safetensors", shards[0])
        return [out / "model.safetensors"]
    files: list[Path] = []
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards, start=1):
        file = out / f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(file, shard)
        files.append(file)
        weight_map.update({plan.name: file.name for plan in shard})
    total = sum(plan.nbytes for plan in plans)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(out / "model.safetensors.index.json", index)
    return files
