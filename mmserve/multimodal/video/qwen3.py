"""Qwen3-VL's video processor (``Qwen3VLVideoProcessor``) and its processor's timestamp text.

The settings, frame sampling and resize size are transformers' own: the class loads and
samples without torchvision, only its ``resize`` needs it, so the pixels go through
``video_processing.preprocess_video`` (the same torch calls) at the size Qwen3-VL's
``smart_resize`` gives (its pixel limits count every frame of the video).

Sampling (``Qwen3VideoSampling``: the checkpoint's ``fps``, ``min_frames``, ``max_frames``,
then the engine's and the request's ``mm_processor_kwargs``) happens once, where a video is
loaded: the decoder picks the frames of encoded videos, and frames given already decoded are
sampled (``do_sample_frames``, on by default) as transformers samples them: ``num_frames``, else
``int(n / fps * target_fps)`` frames clamped to [min_frames, max_frames] and never more than
given, evenly spaced; each kept frame keeps its timestamp. Each frame group (two frames) is
announced by the mean timestamp of its frames (the last frame repeated for an odd count),
written ``<{t:.1f} seconds>``: ``Qwen3VLProcessor.replace_video_token`` turns a video's
``<|video_pad|>`` into, per group, that text + ``<|vision_start|>`` + its ``<|video_pad|>``
tokens + ``<|vision_end|>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
    Qwen3VLVideoProcessor,
    smart_resize,
)

from mmserve.inputs import VideoFrames
from mmserve.multimodal.sampling_keys import without_sampling
from mmserve.multimodal.video.qwen2_vl import _RESAMPLE, VideoSettings
from mmserve.multimodal.video.sampling import VideoSampling

QWEN3_VL_ARCHITECTURE = "Qwen3VLForConditionalGeneration"
_CONFIG_FILES = (
    "processor_config.json",
    "video_preprocessor_config.json",
    "preprocessor_config.json",
)


@dataclass(frozen=True)
class Qwen3VideoSettings(VideoSettings):
    """``VideoSettings`` of Qwen3-VL (its frames are sampled by ``Qwen3VideoSampling``);
    ``min_pixels`` / ``max_pixels`` bound the pixels of all frames together (``size``'s
    shortest / longest edge)."""

    def frame_size(self, height: int, width: int, num_frames: int) -> tuple[int, int]:
        """``Qwen3VLVideoProcessor.resize``'s size (ValueError for fewer than two frames)."""
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            frame_cap = self.max_video_tokens * self.factor * self.factor
            per_frame = max(
                min(frame_cap, self.max_pixels // num_frames), int(self.min_pixels * 1.05)
            )
            max_pixels = per_frame * num_frames
        h, w = smart_resize(
            num_frames,
            height,
            width,
            temporal_factor=self.temporal_patch_size,
            factor=self.factor,
            min_pixels=self.min_pixels,
            max_pixels=max_pixels,
        )
        return int(h), int(w)

    def group_timestamps(self, frames: VideoFrames) -> tuple[float, ...]:
        """Mean timestamp of each frame group (``Qwen3VLProcessor._calculate_timestamps``)."""
        stamps = list(frames.timestamps)
        tp = self.temporal_patch_size
        stamps += stamps[-1:] * (-len(stamps) % tp)
        return tuple((stamps[i] + stamps[i + tp - 1]) / 2 for i in range(0, len(stamps), tp))

    def per_frame_limits(self) -> tuple[int, int]:
        """(min, max) pixels of one frame of a two-frame video, the largest frames any video
        gets (more frames share the limits)."""
        frames = self.temporal_patch_size
        max_pixels = self.max_pixels // frames
        if self.cap_pixels_per_frame:
            frame_cap = self.max_video_tokens * self.factor * self.factor
            max_pixels = max(min(frame_cap, max_pixels), int(self.min_pixels * 1.05))
        return min(-(-self.min_pixels // frames), max_pixels), max_pixels


@dataclass(frozen=True)
class Qwen3VideoSampling(VideoSampling):
    """The frame choice of ``Qwen3VLVideoProcessor.sample_frames``: no rounding to the
    temporal patch size, indices ``linspace(0, total - 1, n).round()``; ``sample_given``:
    whether frames given already decoded are sampled too (its ``do_sample_frames``)."""

    sample_given: bool = True

    @classmethod
    def from_checkpoint(
        cls, path: Path | None, image_processor: Any = None, kwargs: Mapping[str, Any] = {}
    ) -> Qwen3VideoSampling:
        """``Qwen3VLVideoProcessor.from_pretrained(path)``'s sampling settings with ``kwargs``
        (the engine's ``--mm-processor-kwargs``) applied."""
        proc = _video_processor(None if path is None else Path(path), {})
        checkpoint = cls(
            fps=float(proc.fps),
            min_frames=int(proc.min_frames),
            max_frames=int(proc.max_frames),
            temporal_patch_size=int(proc.temporal_patch_size),
            sample_given=bool(proc.do_sample_frames),
        )
        sampling = checkpoint.with_kwargs(kwargs)
        assert isinstance(sampling, Qwen3VideoSampling)
        return sampling

    def num_sampled(self, total_frames: int, video_fps: float) -> int:
        if self.num_frames is not None:
            return min(self.num_frames, total_frames)
        assert self.fps is not None
        wanted = int(total_frames / video_fps * self.fps)
        return min(max(wanted, self.min_frames), self.max_frames, total_frames)

    def indices(self, total_frames: int, video_fps: float) -> list[int]:
        if total_frames < 1:
            raise ValueError("the video has no frames")
        if not video_fps > 0:
            raise ValueError(f"the video has no valid frame rate ({video_fps!r})")
        count = self.num_sampled(total_frames, video_fps)
        return np.linspace(0, total_frames - 1, count).round().astype(int).tolist()

    def sample_frames(self, frames: VideoFrames) -> VideoFrames:
        """``frames`` (given already decoded) as ``sample_frames`` samples them, with their
        rate as metadata; each kept frame keeps its time."""
        total = len(frames.frames)
        if not self.sample_given:
            return frames
        indices = self.indices(total, frames.fps)
        if len(indices) == total:
            return frames
        rate = len(indices) / total * frames.fps
        stamps = tuple(frames.timestamps[i] for i in indices)
        return VideoFrames(frames.frames[indices], rate, stamps)


def _video_processor(path: Path | None, kwargs: dict[str, Any]) -> Qwen3VLVideoProcessor:
    """``Qwen3VLVideoProcessor.from_pretrained(path, **kwargs)`` (its class defaults without a
    config file); ValueError for ``num_frames`` (sampling is by fps)."""
    if path is not None and any((path / name).is_file() for name in _CONFIG_FILES):
        proc = Qwen3VLVideoProcessor.from_pretrained(path, **kwargs)
    else:
        proc = Qwen3VLVideoProcessor(**kwargs)
    if proc.num_frames is not None:
        raise ValueError("video processor num_frames is not supported (sample by fps)")
    return proc


def load_qwen3_video_settings(
    path: Path | str, kwargs: dict[str, Any] | None = None
) -> Qwen3VideoSettings:
    """``Qwen3VLVideoProcessor.from_pretrained(path, **kwargs)``'s settings; ValueError for
    settings ``preprocess_video`` does not implement. The sampling keys of ``kwargs`` are
    ``Qwen3VideoSampling``'s, not read here."""
    proc = _video_processor(Path(path), without_sampling(kwargs or {}))
    size: Any = proc.size  # a SizeDict once loaded (the class attribute is a dict)
    if not proc.do_resize or not size.shortest_edge or not size.longest_edge:
        raise ValueError(
            f"video processor size {size} (do_resize={proc.do_resize}) is not supported"
        )
    resample = _RESAMPLE.get(int(proc.resample))
    if resample is None:
        raise ValueError(f"video processor resample={proc.resample} is not supported")
    normalize = bool(proc.do_normalize)
    settings = Qwen3VideoSettings(
        min_pixels=int(size.shortest_edge),
        max_pixels=int(size.longest_edge),
        patch_size=int(proc.patch_size),
        temporal_patch_size=int(proc.temporal_patch_size),
        merge_size=int(proc.merge_size),
        mean=tuple(float(x) for x in proc.image_mean) if normalize else None,
        std=tuple(float(x) for x in proc.image_std) if normalize else None,
        rescale_factor=float(proc.rescale_factor) if proc.do_rescale else None,
        resample=resample,
        cap_pixels_per_frame=bool(proc.cap_pixels_per_frame),
        max_video_tokens=int(proc.max_video_tokens),
    )
    if not 0 < settings.min_pixels <= settings.max_pixels:
        raise ValueError(f"video processor needs 0 < min_pixels <= max_pixels, got {size}")
    return settings


def timestamp_tokens(
    timestamps: tuple[float, ...], group_length: int, tokenizer: Any, hf_config: Any
) -> tuple[np.ndarray, list[int]]:
    """A video's expansion as token ids and the offset of each group's first video token in
    it. Each ``<t seconds>`` text lies between special tokens, so it is tokenized alone."""
    texts = [f"<{t:.1f} seconds>" for t in timestamps]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    start, end = int(hf_config.vision_start_token_id), int(hf_config.vision_end_token_id)
    frame = [start] + [int(hf_config.video_token_id)] * group_length + [end]
    pieces: list[int] = []
    offsets: list[int] = []
    for text_ids in encoded:
        pieces += text_ids
        offsets.append(len(pieces) + 1)
        pieces += frame
    return np.asarray(pieces, dtype=np.int64), offsets
