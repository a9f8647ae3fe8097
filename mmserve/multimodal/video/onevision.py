"""LLaVA-OneVision video: ``LlavaOnevisionVideoProcessor`` redone without torchvision, the
placeholder count and one ``MultiModalItem`` per frame.

The processor's settings are read in transformers' file order (``processor_config.json``'s
``video_processor``, ``video_preprocessor_config.json``, ``preprocessor_config.json``) over its
class defaults. Every frame is resized to exactly ``size`` (height, width) by the call
torchvision's ``resize`` makes on CPU for uint8 BICUBIC (``interpolate`` with antialiasing on
the uint8 frames), then rescaled and normalized fused as transformers' torchvision backend does.

The model pools each frame's ``P x P`` patch embeddings to ``ceil(P/2)**2`` (bilinear) and
appends one ``image_newline`` after the last frame (``get_video_features``), so the placeholder
``<video>`` becomes ``frames * ceil(P/2)**2 + 1`` tokens (``replace_video_token``). A frame's
embeddings depend on that frame only: each frame is one encoder item (the last one carries the
newline row), keyed by the video's content hash plus the frame index and count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import torch

from mmserve.inputs import MultiModalItem, VideoFrames, VideoGroup
from mmserve.multimodal.hashing import salted
from mmserve.multimodal.video.pixels import rescale_and_normalize
from mmserve.multimodal.video.prep import video_frames
from mmserve.multimodal.video.qwen2_vl import _config_dict

ONEVISION_ARCHITECTURE = "LlavaOnevisionForConditionalGeneration"
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL filter ids -> interpolate modes
# LlavaOnevisionVideoProcessor's class defaults (transformers 5.x)
_DEFAULTS: dict[str, Any] = {
    "size": {"height": 384, "width": 384},
    "image_mean": (0.48145466, 0.4578275, 0.40821073),
    "image_std": (0.26862954, 0.26130258, 0.27577711),
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "resample": 3,
}


def pooled_frame_tokens(hf_config: Any) -> int:
    """Embeddings of one frame after ``apply_pooling``: ``ceil(P/2)**2``, P patches a side."""
    vision = hf_config.vision_config
    return math.ceil(vision.image_size // vision.patch_size / 2) ** 2


@dataclass(frozen=True)
class OnevisionVideoSettings:
    """The settings of the checkpoint's video processor that shape its output, and the
    embeddings one frame gives."""

    height: int
    width: int
    mean: tuple[float, ...] | None  # None: no normalize
    std: tuple[float, ...] | None
    rescale_factor: float | None  # None: no rescale
    resample: str
    frame_tokens: int

    def tokens(self, num_frames: int) -> int:
        """Placeholder tokens of a video of ``num_frames`` frames (one newline at the end)."""
        return num_frames * self.frame_tokens + 1

    def key(self) -> str:
        """Canonical text of the settings (part of a video's content hash)."""
        return json.dumps(self.__dict__, sort_keys=True)


def load_onevision_video_settings(
    path: Path | str, hf_config: Any, kwargs: dict[str, Any] | None = None
) -> OnevisionVideoSettings:
    """The checkpoint's video processor settings (``kwargs``, the merged processor kwargs,
    over them); ValueError for settings this module does not implement or frames the vision
    tower cannot take (``apply_pooling`` views each frame as its ``image_size`` square)."""
    merged = {**_DEFAULTS, **_config_dict(Path(path)), **(kwargs or {})}
    size = dict(merged["size"] or {})
    side = int(hf_config.vision_config.image_size)
    if not merged["do_resize"] or (size.get("height"), size.get("width")) != (side, side):
        raise ValueError(
            f"video processor size {size} (do_resize={merged['do_resize']}) is not supported:"
            f" the vision tower takes {side}x{side} frames"
        )
    resample = _RESAMPLE.get(int(merged["resample"]))
    if resample is None:
        raise ValueError(f"video processor resample={merged['resample']} is not supported")
    normalize = bool(merged["do_normalize"])
    return OnevisionVideoSettings(
        height=side,
        width=side,
        mean=tuple(float(x) for x in merged["image_mean"]) if normalize else None,
        std=tuple(float(x) for x in merged["image_std"]) if normalize else None,
        rescale_factor=float(merged["rescale_factor"]) if merged["do_rescale"] else None,
        resample=resample,
        frame_tokens=pooled_frame_tokens(hf_config),
    )


def preprocess_onevision_video(frames: np.ndarray, settings: OnevisionVideoSettings) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 frames -> ``pixel_values_videos`` of one video, ``[T, 3, h, w]``
    float32, as ``LlavaOnevisionVideoProcessor`` computes them."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    size = (settings.height, settings.width)
    if tuple(video.shape[-2:]) != size:
        video = torch.nn.functional.interpolate(
            video, size=size, mode=settings.resample, align_corners=False, antialias=True
        )
    return rescale_and_normalize(video, settings.mean, settings.std, settings.rescale_factor)


@dataclass(frozen=True)
class PreparedOnevisionVideo:
    """A preprocessed OneVision video: its content hash, ``pixel_values_videos`` and the
    embeddings per frame."""

    mm_hash: str
    pixel_values: np.ndarray  # [T, 3, h, w] float32
    frame_tokens: int
    seconds_per_frame: float

    @property
    def length(self) -> int:
        return len(self.pixel_values) * self.frame_tokens + 1

    def items(
        self, offset: int, cache_salt: str | None = None, starts: Sequence[int] | None = None
    ) -> list[MultiModalItem]:
        """One item per frame from token ``offset`` on (back to back, or frame i at
        ``offset + starts[i]``); the last one ends with the newline."""
        count, tokens = len(self.pixel_values), self.frame_tokens
        if starts is None:
            starts = range(0, count * tokens, tokens)
        base = salted(self.mm_hash, cache_salt)
        return [
            MultiModalItem(
                f"{base}.f{i}/{count}",
                offset + starts[i],
                tokens + (i == count - 1),
                {"pixel_values_videos": self.pixel_values[i : i + 1], "newline": i == count - 1},
                VideoGroup(i, count, self.seconds_per_frame),
            )
            for i in range(count)
        ]


def hash_onevision_video(
    frames: VideoFrames, model_id: str, settings: OnevisionVideoSettings
) -> str:
    """256-bit blake3 of model id, processor settings, fps, timestamps, shape and pixels."""
    array = np.ascontiguousarray(frames.frames)
    hasher = blake3.blake3(f"onevision-video\0{model_id}\0{settings.key()}\0".encode())
    hasher.update(f"{frames.fps!r}\0{frames.timestamps!r}\0{array.shape}\0".encode())
    hasher.update(array.data)
    return hasher.hexdigest()


def checked_onevision_video(
    video: Any, settings: OnevisionVideoSettings, max_tokens: int | None
) -> VideoFrames:
    """``video_frames(video)``, refused (ValueError) when its placeholders alone exceed
    ``max_tokens`` (checked from the frame count, before any preprocessing)."""
    frames = video_frames(video)
    num = frames.frames.shape[0]
    if max_tokens is not None and settings.tokens(num) > max_tokens:
        raise ValueError(
            f"a video of {num} frames needs {settings.tokens(num)} tokens, more than"
            f" max_model_len allows ({max_tokens}): send fewer frames"
        )
    return frames


def preprocessed_onevision(
    frames: VideoFrames, mm_hash: str, settings: OnevisionVideoSettings
) -> PreparedOnevisionVideo:
    pixel_values = preprocess_onevision_video(frames.frames, settings)
    return PreparedOnevisionVideo(mm_hash, pixel_values, settings.frame_tokens, 1 / frames.fps)
