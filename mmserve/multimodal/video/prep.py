"""One decoded video -> ``PreparedVideo`` -> one ``MultiModalItem`` per temporal frame group.

A video reaches this module decoded and sampled: a ``VideoFrames``, a list of PIL images or a
``[T, H, W, 3]`` uint8 array (the last two at ``DEFAULT_VIDEO_FPS``, frames used as given).
Decoding files, bytes and URLs is admission's job before this runs.

Frame groups are the unit of encoding and caching: group ``i`` holds frames
``[i*T, (i+1)*T)`` (T = temporal_patch_size), whose patches the vision tower attends among
themselves only. Its item key is the video's content hash (frames, fps, timestamps, model,
processor settings; tenant salt applied) plus the group index and count, plus its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
from PIL import Image

from mmserve.inputs import MultiModalItem, VideoFrames, VideoGroup
from mmserve.multimodal.hashing import salted
from mmserve.multimodal.video.qwen2_vl import (
    DEFAULT_VIDEO_FPS,
    VideoSettings,
    preprocess_video,
)


@dataclass(frozen=True)
class PreparedVideo:
    """A preprocessed video: its content hash, the processor's flat patches and grid (patch
    units), and the seconds between frame groups (Qwen2.5-VL's ``second_per_grid_t``)."""

    mm_hash: str
    pixel_values: np.ndarray  # [t*h*w, C*T*p*p] float32, frame group major
    grid: tuple[int, int, int]
    second_per_grid_t: float
    merge_size: int
    timestamps: tuple[float, ...] = ()  # per frame group, announced in the prompt (Qwen3-VL)

    @property
    def group_length(self) -> int:
        """Embeddings (placeholder tokens) per frame group."""
        return self.grid[1] * self.grid[2] // self.merge_size**2

    @property
    def length(self) -> int:
        return self.grid[0] * self.group_length

    def items(
        self, offset: int, cache_salt: str | None = None, starts: Sequence[int] | None = None
    ) -> list[MultiModalItem]:
        """One item per frame group, placed from token ``offset`` on (views, no copies):
        back to back, or group i at ``offset + starts[i]``."""
        t, h, w = self.grid
        if starts is None:
            starts = range(0, t * self.group_length, self.group_length)
        base = salted(self.mm_hash, cache_salt)
        patches = self.pixel_values.reshape(t, h * w, -1)
        return [
            MultiModalItem(
                f"{base}.g{i}/{t}",
                offset + starts[i],
                self.group_length,
                {"pixel_values": patches[i], "image_grid_thw": (1, h, w)},
                VideoGroup(i, t, self.second_per_grid_t),
            )
            for i in range(t)
        ]


def video_frames(video: Any) -> VideoFrames:
    """``video`` as ``VideoFrames`` with a ``[T, H, W, 3]`` uint8 array; ValueError naming what
    is wrong (undecoded sources, empty, bad shapes, dtypes or sizes)."""
    if isinstance(video, (str, bytes)):
        raise ValueError(
            "video sources must be decoded first: pass VideoFrames, a list of PIL images or a"
            f" [T, H, W, 3] uint8 array, got {type(video).__name__}"
        )
    if isinstance(video, VideoFrames):
        frames, fps, stamps = video.frames, float(video.fps), tuple(video.timestamps)
    else:
        frames, fps, stamps = video, DEFAULT_VIDEO_FPS, ()
    if isinstance(frames, (list, tuple)):
        if not frames or not all(isinstance(f, (Image.Image, np.ndarray)) for f in frames):
            raise ValueError("a video given as a list needs PIL images or [H, W, 3] arrays")
        arrays = [np.asarray(f.convert("RGB")) if isinstance(f, Image.Image) else f for f in frames]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise ValueError(f"video frames differ in shape: {sorted(shapes)}")
        frames = np.stack(arrays)
    if not isinstance(frames, np.ndarray):
        raise ValueError(f"unsupported video of type {type(frames).__name__}")
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(
            f"video frames must be a [T, H, W, 3] uint8 array, got {frames.dtype} {frames.shape}"
        )
    if frames.shape[0] == 0 or min(frames.shape[1:3]) < 1:
        raise ValueError(f"video has no pixels: shape {frames.shape}")
    if not fps > 0:
        raise ValueError(f"video fps must be > 0, got {fps}")
    if not stamps:
        stamps = tuple(i / fps for i in range(frames.shape[0]))
    if len(stamps) != frames.shape[0]:
        raise ValueError(f"video has {frames.shape[0]} frames but {len(stamps)} timestamps")
    return VideoFrames(frames, fps, stamps)


def video_tokens(frames: VideoFrames, settings: VideoSettings) -> int:
    """Placeholder tokens of a video, from its shape alone (before any preprocessing)."""
    num, height, width = frames.frames.shape[:3]
    t, h, w = settings.grid(num, height, width)
    return t * h * w // settings.merge_size**2


def hash_video(frames: VideoFrames, model_id: str, settings: VideoSettings) -> str:
    """256-bit blake3 of model id, processor settings, fps, timestamps, shape and pixels."""
    array = np.ascontiguousarray(frames.frames)
    hasher = blake3.blake3(f"video\0{model_id}\0{settings.key()}\0".encode())
    hasher.update(f"{frames.fps!r}\0{frames.timestamps!r}\0{array.shape}\0".encode())
    hasher.update(array.data)
    return hasher.hexdigest()


def checked_video(video: Any, settings: VideoSettings, max_tokens: int | None) -> VideoFrames:
    """``video_frames(video)`` (sampled already: every frame is used), refused (ValueError)
    when its placeholders alone exceed ``max_tokens`` (checked from the shape, before any
    preprocessing)."""
    frames = video_frames(video)
    tokens = video_tokens(frames, settings)
    if max_tokens is not None and tokens > max_tokens:
        num, height, width = frames.frames.shape[:3]
        raise ValueError(
            f"a video of {num} frames of {width}x{height} needs {tokens} tokens, more than"
            f" max_model_len allows ({max_tokens}): send fewer frames or smaller ones"
        )
    return frames


def preprocessed(frames: VideoFrames, mm_hash: str, settings: VideoSettings) -> PreparedVideo:
    pixel_values, grid = preprocess_video(frames.frames, settings)
    seconds = settings.temporal_patch_size / frames.fps
    stamps = settings.group_timestamps(frames)
    return PreparedVideo(mm_hash, pixel_values, grid, seconds, settings.merge_size, stamps)


def prepare_video(
    video: Any, model_id: str, settings: VideoSettings, max_tokens: int | None = None
) -> PreparedVideo:
    """Check, hash and preprocess one decoded video (see ``checked_video``)."""
    frames = checked_video(video, settings, max_tokens)
    return preprocessed(frames, hash_video(frames, model_id, settings), settings)
