"""A model weights fingerprint that reads a few megabytes, not the whole checkpoint."""

from __future__ import annotations

import struct
from pathlib import Path

import blake3

WHOLE_FILE_BYTES = 64 << 20  # files up to this size are hashed whole
SAMPLES = 32  # evenly spaced windows of a larger file's data
SAMPLE_BYTES = 64 << 10
CONFIG_FILES = ("config.json", "preprocessor_config.json")


def weights_fingerprint(path: Path) -> str:
    """blake3 over the configs that shape encoder outputs and, per ``*.safetensors`` file (in
    name order): its name, size, header (every tensor's name, dtype, shape and offsets) and
    the whole file up to 64 MiB, else 32 windows of 64 KiB spread over its data.

    Failure mode: an edit of a file over 64 MiB that keeps every tensor's name, dtype and shape
    and changes only bytes outside the sampled windows keeps the fingerprint (a fine-tune
    changes nearly every window; a hand-patched single weight may not)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path} to fingerprint")
    hasher = blake3.blake3(b"mmserve-weights-fingerprint\0v1\0")
    for name in CONFIG_FILES:
        config = Path(path) / name
        if config.exists():
            hasher.update(f"{name}\0".encode() + config.read_bytes() + b"\0")
    for file in files:
        size = file.stat().st_size
        hasher.update(f"file\0{file.name}\0{size}\0".encode())
        with open(file, "rb") as fh:
            if size <= WHOLE_FILE_BYTES:
                hasher.update(fh.read())
                continue
            (header_len,) = struct.unpack("<Q", fh.read(8))
            hasher.update(fh.read(header_len))
            data_start, data_len = 8 + header_len, size - 8 - header_len
            step = max(1, (data_len - SAMPLE_BYTES) // max(1, SAMPLES - 1))
            for i in range(SAMPLES):
                fh.seek(data_start + min(i * step, max(0, data_len - SAMPLE_BYTES)))
                hasher.update(fh.read(SAMPLE_BYTES))
    return hasher.hexdigest()
