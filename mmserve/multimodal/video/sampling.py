"""Which frames of a video the model sees: Qwen2-VL's video processor's sampling rule.

The settings come from the checkpoint (``video_preprocessor_config.json``, else the processor's
defaults as qwen-vl-utils and vLLM use them: 2 frames per second, 4 to 768 frames, rounded to
the temporal patch size), then ``--mm-processor-kwargs``, then a request's
``mm_processor_kwargs`` (``fps``, ``num_frames``, ``min_frames``, ``max_frames``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmserve.inputs import VideoFrames
from mmserve.multimodal.sampling_keys import VIDEO_KWARGS

#: the ``mm_processor_kwargs`` keys of frame sampling (not the image processor's);
#: ``do_sample_frames`` (vLLM clients send ``true``) may only be true: frames are always sampled
_FIELDS = ("fps", "num_frames", "min_frames", "max_frames", "temporal_patch_size")
VIDEO_CONFIG_FILE = "video_preprocessor_config.json"


@dataclass(frozen=True)
class VideoSampling:
    """Frame sampling settings of one request (``fps`` and ``num_frames`` exclude each other:
    ``num_frames`` frames spread evenly, else ``fps`` frames per second of video clamped to
    [``min_frames``, ``max_frames``]); the count is rounded to ``temporal_patch_size``.

    Invariants (``__post_init__``): counts are positive integers, ``fps`` a positive finite
    number, ``min_frames <= max_frames``, exactly one of ``fps`` / ``num_frames`` is set.
    """

    fps: float | None = 2.0
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        for name in ("num_frames", "min_frames", "max_frames", "temporal_patch_size"):
            value = getattr(self, name)
            if value is None and name == "num_frames":
                continue
            if type(value) is not int or value < 1:
                raise ValueError(f"video {name} must be a positive integer, got {value!r}")
        fps = self.fps
        if fps is not None and (
            isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < float("inf")
        ):
            raise ValueError(f"video fps must be a positive number, got {fps!r}")
        if (fps is None) == (self.num_frames is None):
            raise ValueError("video sampling needs exactly one of fps and num_frames")
        if self.min_frames > self.max_frames:
            raise ValueError(
                f"video min_frames ({self.min_frames}) must be <= max_frames ({self.max_frames})"
            )

    @classmethod
    def from_checkpoint(
        cls, path: Path | None, image_processor: Any = None, kwargs: Mapping[str, Any] = {}
    ) -> VideoSampling:
        """The checkpoint's settings (its video processor config, else these defaults with the
        image processor's temporal patch size) with ``kwargs`` (the engine's
        ``--mm-processor-kwargs``) applied."""
        settings: dict[str, Any] = {}
        patch = getattr(image_processor, "temporal_patch_size", None)
        if isinstance(patch, int):
            settings["temporal_patch_size"] = patch
        config = path / VIDEO_CONFIG_FILE if path is not None else None
        if config is not None and config.is_file():
            saved = json.loads(config.read_text())
            settings.update({k: saved[k] for k in _FIELDS if saved.get(k) is not None})
            if "num_frames" in settings:
                settings.setdefault("fps", None)
        return cls(**settings).with_kwargs(kwargs)

    def with_kwargs(self, kwargs: Mapping[str, Any] | None) -> VideoSampling:
        """These settings with the video keys of ``kwargs`` (merged processor kwargs) applied;
        ``num_frames`` replaces ``fps`` and the other way round; both at once is an error."""
        changes = {k: v for k, v in (kwargs or {}).items() if k in VIDEO_KWARGS}
        sample = changes.pop("do_sample_frames", True)
        if sample is not True:
            raise ValueError(
                f"mm_processor_kwargs: do_sample_frames must be true (frames are always sampled"
                f" by fps or num_frames), got {sample!r}"
            )
        if not changes:
            return self
        if changes.get("fps") is not None and changes.get("num_frames") is not None:
            raise ValueError("mm_processor_kwargs: fps and num_frames exclude each other")
        if changes.get("num_frames") is not None:
            changes["fps"] = None
        elif changes.get("fps") is not None:
            changes["num_frames"] = None
        try:
            return dataclasses.replace(self, **changes)
        except ValueError as exc:
            raise ValueError(f"mm_processor_kwargs: {exc}") from None

    def key(self) -> str:
        """Canonical text of the settings (memo keys)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def num_sampled(self, total_frames: int, video_fps: float) -> int:
        """How many frames ``indices`` picks (transformers' ``sample_frames`` count). Where
        transformers fails (a count of 0, or more frames asked for than the video has), all
        frames up to the asked count are taken instead; the processor pads the last group."""
        patch = self.temporal_patch_size
        if self.num_frames is not None:
            count = round(self.num_frames / patch) * patch
        else:
            assert self.fps is not None
            cap = math.floor(min(self.max_frames, total_frames) / patch) * patch
            wanted = total_frames / video_fps * self.fps
            count = math.floor(min(max(wanted, self.min_frames), cap, total_frames) / patch) * patch
        if count < 1:
            count = min(total_frames, self.num_frames or self.min_frames)
        return min(count, total_frames)

    def indices(self, total_frames: int, video_fps: float) -> list[int]:
        """The sampled frame indices, as ``torch.arange(0, total, total / n).int()`` gives them
        (steps computed in double precision, values rounded to float32, then truncated)."""
        if total_frames < 1:
            raise ValueError("the video has no frames")
        if not video_fps > 0:
            raise ValueError(f"the video has no valid frame rate ({video_fps!r})")
        count = self.num_sampled(total_frames, video_fps)
        step = total_frames / count
        length = math.ceil(total_frames / step)
        values = (np.arange(length, dtype=np.float64) * step).astype(np.float32)
        return [int(i) for i in values.astype(np.int64)]

    def sample_frames(self, frames: VideoFrames) -> VideoFrames:
        """Frames given already decoded, as the model's video processor samples them: all of
        them (Qwen2-VL's does not sample)."""
        return frames


def sampled_timing(
    indices: list[int], total_frames: int, video_fps: float
) -> tuple[float, tuple[float, ...]]:
    """The rate of the sampled frames and each one's time in seconds (transformers'
    ``VideoMetadata.sampled_fps`` and ``timestamps``)."""
    rate = len(indices) / total_frames * video_fps
    return rate, tuple(i / video_fps for i in indices)
