"""SmolVLM2 video (``SmolVLMVideoProcessor``): which checkpoints take videos, the frame
sampling, the frames' pixels and the checks before them.

A checkpoint takes videos when its processor is ``SmolVLMProcessor`` with a video processor
(``video_preprocessor_config.json``, a ``video_processor`` in ``processor_config.json``, or
``video_sampling`` in ``preprocessor_config.json``); SmolVLM (v1, ``Idefics3Processor``) does
not. The settings are ``SmolVLMVideoProcessor.from_pretrained``'s own (the class loads and
samples without torchvision; only its resize needs it): ``video_sampling``'s ``fps`` and
``max_frames`` (its ``num_frames``), and its ``video_size``, replaced by the image processor's
``size`` where the config has one, as transformers does.

Sampling (``SmolVideoSampling``) is ``SmolVLMVideoProcessor.sample_frames``: ``round(fps *
duration)`` frames, at most ``max_frames``, at least one, evenly spaced (``linspace`` truncated,
duplicates dropped) over the video, or over it less ``skip_secs`` at each end when the video is
long enough; each kept frame keeps its time ``index / video fps``. A request's
``mm_processor_kwargs`` may set ``fps`` and ``num_frames`` (or ``max_frames``: the same cap).

Pixels (``preprocess_smolvlm_video``): each frame resized so its longest edge is ``size``'s
(even short side, ``get_resize_output_image_size``), then to the square tile
(``max_image_size``), both by the call torchvision's ``resize`` makes on CPU for uint8 frames
(``interpolate`` with antialiasing; LANCZOS natively since torchvision 0.27), then rescaled and
normalized fused as transformers' torchvision backend does. Frames are never split into tiles.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

from mmserve.inputs import VideoFrames
from mmserve.multimodal.sampling_keys import VIDEO_KWARGS, without_sampling
from mmserve.multimodal.video.pixels import rescale_and_normalize
from mmserve.multimodal.video.sampling import VideoSampling

SMOLVLM_PROCESSOR = "SmolVLMProcessor"
_RESAMPLE = {1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL filter ids -> interpolate modes
_MAX_SIDE = 4096  # video_processing_smolvlm.MAX_IMAGE_SIZE


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def declares_video(path: Path | str | None) -> bool:
    """Whether the checkpoint's processor is ``SmolVLMProcessor`` with a video processor."""
    if path is None or not str(path):
        return False
    root = Path(path)
    processor, image = (
        _json(root / "processor_config.json"),
        _json(root / "preprocessor_config.json"),
    )
    name = processor.get("processor_class") or image.get("processor_class")
    if name != SMOLVLM_PROCESSOR:
        return False
    return (
        (root / "video_preprocessor_config.json").is_file()
        or "video_processor" in processor
        or "video_sampling" in image
    )


def load_smolvlm_video_processor(
    path: Path | str, kwargs: Mapping[str, Any] | None = None
) -> SmolVLMVideoProcessor:
    """``SmolVLMVideoProcessor.from_pretrained(path)`` with the non-sampling ``kwargs``."""
    return SmolVLMVideoProcessor.from_pretrained(path, **without_sampling(kwargs or {}))


def smolvlm_indices(
    total: int, video_fps: float, fps: float, max_frames: int, skip_secs: float = 1
) -> list[int]:
    """``SmolVLMVideoProcessor.sample_frames`` for a video of ``total`` frames at
    ``video_fps`` (duration ``total / video_fps``, as transformers' PyAV reader gives it)."""
    if total < 1:
        raise ValueError("the video has no frames")
    if not video_fps > 0:
        raise ValueError(f"the video has no valid frame rate ({video_fps!r})")
    duration = total / video_fps
    desired = max(min(int(round(fps * duration)), max_frames), 1)
    start, end = 0, total - 1
    if skip_secs > 0 and (duration - 2 * skip_secs) > (max_frames * fps):
        start, end = int(skip_secs * video_fps), int(total - skip_secs * video_fps)
    start, end = max(0, start), min(end, total - 1)
    if start >= end:
        start, end = 0, total - 1
    return [int(i) for i in np.unique(np.linspace(start, end, desired, dtype=int))]


@dataclass(frozen=True)
class SmolVideoSampling(VideoSampling):
    """SmolVLM2's frame choice (``smolvlm_indices``): ``fps`` frames a second of video, at most
    ``max_frames``; frames given already decoded are sampled the same way."""

    fps: float | None = 1.0
    max_frames: int = 64
    min_frames: int = 1
    temporal_patch_size: int = 1
    skip_secs: float = 1

    @classmethod
    def from_checkpoint(
        cls, path: Path | None, image_processor: Any = None, kwargs: Mapping[str, Any] = {}
    ) -> SmolVideoSampling:
        """The checkpoint's ``video_sampling`` (these defaults without one) with ``kwargs`` (the
        engine's ``--mm-processor-kwargs``) applied."""
        sampling = cls()
        if declares_video(path):
            assert path is not None
            proc = load_smolvlm_video_processor(path)
            sampling = cls(fps=float(proc.fps), max_frames=int(proc.num_frames))
        return sampling.with_kwargs(kwargs)

    def with_kwargs(self, kwargs: Mapping[str, Any] | None) -> SmolVideoSampling:
        """These settings with ``fps``, ``num_frames`` / ``max_frames`` (the frame cap, as
        transformers' SmolVLM reads ``num_frames``) of ``kwargs`` applied."""
        changes = {k: v for k, v in (kwargs or {}).items() if k in VIDEO_KWARGS and v is not None}
        if changes.pop("do_sample_frames", True) is not True:
            raise ValueError("mm_processor_kwargs: do_sample_frames must be true")
        if "min_frames" in changes:
            raise ValueError(
                "mm_processor_kwargs: SmolVLM samples videos by fps and num_frames (max_frames);"
                " min_frames is not one of its settings"
            )
        if "num_frames" in changes:
            changes["max_frames"] = changes.pop("num_frames")
        if not changes:
            return self
        try:
            return dataclasses.replace(self, **changes)
        except ValueError as exc:
            raise ValueError(f"mm_processor_kwargs: {exc}") from None

    def num_sampled(self, total_frames: int, video_fps: float) -> int:
        return len(self.indices(total_frames, video_fps))

    def indices(self, total_frames: int, video_fps: float) -> list[int]:
        assert self.fps is not None
        return smolvlm_indices(total_frames, video_fps, self.fps, self.max_frames, self.skip_secs)

    def sample_frames(self, frames: VideoFrames) -> VideoFrames:
        """Frames given already decoded, sampled at their own rate; each kept frame keeps its
        time, the video its duration."""
        total = len(frames.frames)
        duration = frames.duration if frames.duration is not None else total / frames.fps
        indices = self.indices(total, frames.fps)
        if len(indices) == total:
            return dataclasses.replace(frames, duration=duration)
        rate = len(indices) / total * frames.fps
        stamps = tuple(frames.timestamps[i] for i in indices)
        return VideoFrames(frames.frames[indices], rate, stamps, duration)


@dataclass(frozen=True)
class SmolVideoSettings:
    """The video processor's settings that shape the frames, and the embeddings of one."""

    longest_edge: int | None  # the first resize: longest edge (None: to ``height_width``)
    height_width: tuple[int, int] | None
    tile: int  # max_image_size: frames end square, the vision tower's image_size
    mean: tuple[float, ...] | None  # None: no normalize
    std: tuple[float, ...] | None
    rescale_factor: float | None  # None: no rescale
    resample: str
    frame_tokens: int  # image_seq_len

    def min_tokens(self, num_frames: int) -> int:
        """The fewest tokens a video's frames take in the prompt: per frame its ``<image>``
        run and three tags, one token at least for each later frame's timestamp."""
        return num_frames * (self.frame_tokens + 3) + num_frames - 1

    def key(self) -> str:
        """Canonical text of the settings (part of a video's content hash)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def load_smolvlm_video_settings(
    path: Path | str, hf_config: Any, frame_tokens: int, kwargs: Mapping[str, Any] | None = None
) -> SmolVideoSettings:
    """The checkpoint's video processor settings (``kwargs`` applied); ValueError for
    settings this module does not implement or frames the vision tower cannot take."""
    proc = load_smolvlm_video_processor(path, kwargs)
    tile = int(proc.max_image_size["longest_edge"])
    if tile != hf_config.vision_config.image_size:
        raise ValueError(
            f"the video processor's max_image_size ({tile}) must be the vision tower's"
            f" image_size ({hf_config.vision_config.image_size})"
        )
    size = dict(proc.size or {})
    if not proc.do_resize or not (size.get("longest_edge") or size.get("height")):
        raise ValueError(f"video processor size {size} (do_resize={proc.do_resize}) unsupported")
    resample = _RESAMPLE.get(int(proc.resample))
    if resample is None:
        raise ValueError(f"video processor resample={proc.resample} is not supported")
    longest = size.get("longest_edge")
    normalize = bool(proc.do_normalize)
    return SmolVideoSettings(
        longest_edge=int(longest) if longest else None,
        height_width=None if longest else (int(size["height"]), int(size["width"])),
        tile=tile,
        mean=tuple(float(x) for x in proc.image_mean) if normalize else None,
        std=tuple(float(x) for x in proc.image_std) if normalize else None,
        rescale_factor=float(proc.rescale_factor) if proc.do_rescale else None,
        resample=resample,
        frame_tokens=frame_tokens,
    )


def first_size(height: int, width: int, settings: SmolVideoSettings) -> tuple[int, int]:
    """The size of the first resize (``get_resize_output_image_size``: the longest edge at
    ``size``'s, at most 4096, the other kept in ratio and rounded up to even)."""
    if settings.longest_edge is None:
        assert settings.height_width is not None
        return settings.height_width
    side = min(_MAX_SIDE, settings.longest_edge)
    ratio = width / height
    if width >= height:
        width, height = side, int(side / ratio)
        height += height % 2
    else:
        height, width = side, int(side * ratio)
        width += width % 2
    return max(height, 1), max(width, 1)


def _resize(video: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """torchvision's ``resize`` of uint8 NCHW frames on CPU (skipped at the same size)."""
    if tuple(video.shape[-2:]) == size:
        return video
    return torch.nn.functional.interpolate(
        video, size=size, mode=mode, align_corners=False, antialias=True
    )


def preprocess_smolvlm_video(frames: np.ndarray, settings: SmolVideoSettings) -> np.ndarray:
    """``[T, H, W, 3]`` uint8 frames -> ``[T, 3, tile, tile]`` float32, as
    ``SmolVLMVideoProcessor`` computes one video's ``pixel_values``."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    height, width = video.shape[-2:]
    video = _resize(video, first_size(height, width, settings), settings.resample)
    video = _resize(video, (settings.tile, settings.tile), settings.resample)
    return rescale_and_normalize(video, settings.mean, settings.std, settings.rescale_factor)
