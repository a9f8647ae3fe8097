"""Synthetic test videos (PyAV) whose frames carry their own index, and transformers' frame
sampling rule read from its source (its video processor needs torchvision, absent here)."""

from __future__ import annotations

import ast
import io
import math
import types
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch
import transformers

BITS = 8  # frame i: column block b is white when bit b of i is set


def make_video(
    num_frames: int = 90,
    fps: int = 30,
    size: tuple[int, int] = (64, 48),
    container: str = "mp4",
    codec: str = "libx264",
) -> bytes:
    """``num_frames`` frames of ``size`` (width, height) at ``fps``; frame i shows i in binary
    as white column blocks (robust to lossy coding)."""
    width, height = size
    block = width // BITS
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(num_frames):
            pixels = np.zeros((height, width, 3), np.uint8)
            for bit in range(BITS):
                if i >> bit & 1:
                    pixels[:, bit * block : (bit + 1) * block] = 255
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def frame_index(frame: np.ndarray) -> int:
    """The index ``make_video`` drew into ``frame``."""
    block = frame.shape[1] // BITS
    bits = [frame[:, b * block : (b + 1) * block].mean() > 128 for b in range(BITS)]
    return sum(1 << b for b, on in enumerate(bits) if on)


def hf_sample_frames() -> Any:
    """``Qwen2VLVideoProcessor.sample_frames`` compiled from transformers' own source."""
    source_file = (
        Path(transformers.__file__).parent / "models/qwen2_vl/video_processing_qwen2_vl.py"
    )
    tree = ast.parse(source_file.read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("VideoProcessor")
    )
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames")
    fn.returns = None
    for arg in (*fn.args.args, *fn.args.kwonlyargs):
        arg.annotation = None
    namespace: dict[str, Any] = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), str(source_file), "exec"), namespace)
    sample = namespace["sample_frames"]
    defaults = types.SimpleNamespace(
        num_frames=None, fps=None, temporal_patch_size=2, min_frames=4, max_frames=768
    )

    def run(total: int, video_fps: float, **kwargs: Any) -> list[int]:
        meta = types.SimpleNamespace(total_num_frames=total, fps=video_fps)
        return [int(i) for i in sample(defaults, meta, **kwargs)]

    return run
