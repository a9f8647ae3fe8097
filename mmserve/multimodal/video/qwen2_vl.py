"""Qwen2-VL's video processor (``Qwen2VLVideoProcessor``) redone without torchvision.

transformers' video processor imports torchvision, which this install lacks, so its settings
are read from the checkpoint's files in transformers' order (``processor_config.json``'s
``video_processor``, else ``video_preprocessor_config.json``, else ``preprocessor_config.json``)
over the class defaults, and its arithmetic is repeated step for step on the decoded frames:

- every frame is resized to one ``smart_resize`` size (the per-frame pixel cap of
  ``cap_pixels_per_frame`` included) by ``torch.nn.functional.interpolate`` on the uint8
  NCHW frames with antialiasing: the call torchvision's ``resize`` makes on CPU for BICUBIC
  (its native uint8 path; BILINEAR there too on AVX2 CPUs);
- rescale and normalize fused as transformers does (``(x - mean / r) / (std / r)`` in float32);
- an odd frame count is padded by repeating the last frame, then flat patches
  ``[t*h*w, C*T*p*p]`` in the processor's order (temporal group major) and the grid (t, h, w).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from mmserve.inputs import VideoFrames

DEFAULT_VIDEO_FPS = 2.0  # frames given without a rate (Qwen's and vLLM's default sampling)
VIDEO_ARCHITECTURES = (
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",  # settings: multimodal.qwen3_video
)
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL filter ids -> interpolate modes
# Qwen2VLVideoProcessor's class defaults (transformers 5.x)
_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": _CLIP_MEAN,
    "image_std": _CLIP_STD,
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "resample": 3,
    "cap_pixels_per_frame": None,
    "max_video_tokens": 128000,
}


@dataclass(frozen=True)
class VideoSettings:
    """The settings of the checkpoint's video processor that shape its output."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, ...] | None  # None: no normalize
    std: tuple[float, ...] | None
    rescale_factor: float | None  # None: no rescale
    resample: str
    cap_pixels_per_frame: bool
    max_video_tokens: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def frame_size(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        """The size every frame is resized to (``Qwen2VLVideoProcessor.resize``)."""
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            total = int(self.max_video_tokens * self.factor * self.factor * 0.9)
            share = total * self.temporal_patch_size // num_frames
            max_pixels = max(min(max_pixels, share), int(self.min_pixels * 1.05))
        h, w = smart_resize(
            height, width, factor=self.factor, min_pixels=self.min_pixels, max_pixels=max_pixels
        )
        return int(h), int(w)

    def grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) patch grid of a video of ``num_frames`` frames of height x width."""
        h, w = self.frame_size(height, width, num_frames)
        t = math.ceil(num_frames / self.temporal_patch_size)
        return t, h // self.patch_size, w // self.patch_size

    def group_timestamps(self, frames: VideoFrames) -> tuple[float, ...]:
        """Seconds announced before each frame group in the prompt: none (Qwen2-VL)."""
        return ()

    def key(self) -> str:
        """Canonical text of the settings (part of a video's content hash)."""
        return json.dumps(self.__dict__, sort_keys=True)


def _config_dict(path: Path) -> dict[str, Any]:
    nested = path / "processor_config.json"
    if nested.is_file():
        video = json.loads(nested.read_text()).get("video_processor")
        if isinstance(video, dict):
            return video
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if (path / name).is_file():
            data = json.loads((path / name).read_text())
            return data if isinstance(data, dict) else {}
    return {}


def load_video_settings(path: Path | str, kwargs: dict[str, Any] | None = None) -> VideoSettings:
    """The checkpoint's video processor settings with ``kwargs`` (the merged processor
    kwargs) over them, as ``Qwen2VLVideoProcessor.from_pretrained(path, **kwargs)`` has them;
    ValueError for settings this module does not implement."""
    merged = {**_DEFAULTS, **_config_dict(Path(path)), **(kwargs or {})}
    size = dict(merged["size"] or {})
    if merged.get("min_pixels") is not None:
        size["shortest_edge"] = merged["min_pixels"]
    if merged.get("max_pixels") is not None:
        size["longest_edge"] = merged["max_pixels"]
    if not merged["do_resize"] or not size.get("shortest_edge") or not size.get("longest_edge"):
        raise ValueError(
            f"video processor size {size} (do_resize={merged['do_resize']}) is not supported"
        )
    resample = _RESAMPLE.get(int(merged["resample"]))
    if resample is None:
        raise ValueError(f"video processor resample={merged['resample']} is not supported")
    normalize = bool(merged["do_normalize"])
    settings = VideoSettings(
        min_pixels=int(size["shortest_edge"]),
        max_pixels=int(size["longest_edge"]),
        patch_size=int(merged["patch_size"]),
        temporal_patch_size=int(merged["temporal_patch_size"]),
        merge_size=int(merged["merge_size"]),
        mean=tuple(float(x) for x in merged["image_mean"]) if normalize else None,
        std=tuple(float(x) for x in merged["image_std"]) if normalize else None,
        rescale_factor=float(merged["rescale_factor"]) if merged["do_rescale"] else None,
        resample=resample,
        cap_pixels_per_frame=bool(merged["cap_pixels_per_frame"]),
        max_video_tokens=int(merged["max_video_tokens"]),
    )
    if not 0 < settings.min_pixels <= settings.max_pixels:
        raise ValueError(f"video processor needs 0 < min_pixels <= max_pixels, got {size}")
    return settings


def preprocess_video(
    frames: np.ndarray, settings: VideoSettings
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``[T, H, W, 3]`` uint8 frames -> (``pixel_values_videos`` [t*h*w, C*T*p*p] float32,
    ``video_grid_thw`` (t, h, w)), as ``Qwen2VLVideoProcessor`` computes them."""
    num_frames, height, width, channels = frames.shape
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    new_h, new_w = settings.frame_size(height, width, num_frames)
    if (new_h, new_w) != (height, width):
        video = torch.nn.functional.interpolate(
            video, size=(new_h, new_w), mode=settings.resample, align_corners=False, antialias=True
        )
    values = _rescale_normalize(video, settings)
    p, m, tp = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    if pad := -num_frames % tp:
        values = torch.cat((values, values[-1:].expand(pad, -1, -1, -1)))
    gt, gh, gw = values.shape[0] // tp, new_h // p, new_w // p
    patches = values.view(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(gt * gh * gw, channels * tp * p * p)
    return flat.numpy(), (gt, gh, gw)


def _rescale_normalize(video: torch.Tensor, settings: VideoSettings) -> torch.Tensor:
    """transformers' fused ``rescale_and_normalize`` of the torchvision backend."""
    mean, std, scale = settings.mean, settings.std, settings.rescale_factor
    if mean is not None and std is not None:
        mean_t, std_t = torch.tensor(mean), torch.tensor(std)
        if scale is not None:
            mean_t, std_t = mean_t * (1.0 / scale), std_t * (1.0 / scale)
        return video.to(torch.float32).sub_(mean_t.view(-1, 1, 1)).div_(std_t.view(-1, 1, 1))
    if scale is not None:
        return video * scale
    return video.to(torch.float32)
