"""Every video source -> ``VideoFrames``: read under the media policy, decode, sample.

Sources: encoded bytes, a path or ``file://`` URL (under the allowed local media path), a
``data:video/...;base64,`` URL, an http(s) URL (fetched under the SSRF policy with the video
byte limit), or frames already decoded (a ``VideoFrames``, a ``[T, H, W, 3]`` uint8 array, or a
list of PIL images / ``[H, W, 3]`` arrays). Frames given without times are taken as sampled at
the request's ``fps`` (2 by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mmserve.inputs import VideoFrames
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.media.limits import VideoTooLargeError
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.video.decode import VideoLimits, decode_video
from mmserve.multimodal.video.sampling import VideoSampling

DEFAULT_FRAMES_FPS = 2.0


def _as_rgb_array(frame: Any) -> np.ndarray:
    if isinstance(frame, Image.Image):
        frame = frame.convert("RGB") if frame.mode != "RGB" else frame
    array = np.asarray(frame)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(
            f"a video frame must be an RGB image or a [H, W, 3] uint8 array, got"
            f" {array.dtype} {array.shape}"
        )
    return array


def checked_frames(frames: Any, fps: float, limits: VideoLimits) -> VideoFrames:
    """Frames given by the caller as one ``[T, H, W, 3]`` uint8 array (checked against the
    limits); a ``VideoFrames`` keeps its rate and times, other frames get ``fps``."""
    given = frames if isinstance(frames, VideoFrames) else None
    raw = given.frames if given is not None else frames
    if isinstance(raw, np.ndarray) and raw.ndim == 4:
        array = raw
        if array.dtype != np.uint8 or array.shape[3] != 3:
            raise ValueError(
                f"video frames must be [T, H, W, 3] uint8, got {array.dtype} {array.shape}"
            )
    elif isinstance(raw, (list, tuple)) and raw:
        arrays = [_as_rgb_array(f) for f in raw]
        if len({a.shape for a in arrays}) > 1:
            raise ValueError("the frames of a video must all have the same size")
        array = np.stack(arrays)
    else:
        raise ValueError(f"unsupported video input of type {type(raw).__name__}")
    count, height, width = array.shape[:3]
    if count < 1 or height < 1 or width < 1:
        raise ValueError(f"video frames have zero size {array.shape}")
    if width * height > limits.max_frame_pixels:
        raise VideoTooLargeError(
            f"video frames of {width}x{height} pixels exceed the limit of"
            f" {limits.max_frame_pixels} pixels"
        )
    if count > limits.max_frames or array.nbytes > limits.max_output_bytes:
        raise VideoTooLargeError(
            f"{count} video frames of {width}x{height} exceed the limits ({limits.max_frames}"
            f" frames, {limits.max_output_bytes} bytes)"
        )
    if given is not None:
        if len(given.timestamps) != count:
            raise ValueError(f"a video has {count} frames but {len(given.timestamps)} timestamps")
        return given if array is raw else VideoFrames(array, given.fps, given.timestamps)
    return VideoFrames(array, fps, tuple(i / fps for i in range(count)))


def is_encoded(source: Any) -> bool:
    """Whether ``source`` names or holds an encoded video (not frames)."""
    return isinstance(source, (bytes, bytearray, memoryview, str, Path))


class VideoLoader:
    """Reads (under the media policy, with the video byte limit), decodes and samples one
    video, or checks frames given already decoded.

    Holds only picklable settings, so the media worker processes run the same code; no cache
    (``video.memo`` is the server process's).
    """

    def __init__(
        self,
        media_policy: MediaFetchPolicy,
        sampling: VideoSampling,
        limits: VideoLimits | None = None,
    ) -> None:
        self.media_policy = media_policy
        self.sampling = sampling
        self.limits = limits or VideoLimits()
        self.fetcher = MediaFetcher(media_policy)

    def sampling_for(self, merged_kwargs: Mapping[str, Any] | None) -> VideoSampling:
        """The engine's sampling with a request's merged ``mm_processor_kwargs`` applied."""
        return self.sampling.with_kwargs(merged_kwargs)

    def read(self, source: Any) -> bytes:
        """The encoded bytes behind ``source`` (blocking; http(s) gets a client of its own)."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            return bytes(source)
        if isinstance(source, (str, Path)):
            return self.fetcher.load_blocking(str(source), "video")
        raise ValueError(f"unsupported video input of type {type(source).__name__}")

    def load(self, source: Any, sampling: VideoSampling | None = None) -> VideoFrames:
        """``source`` decoded and sampled (default: the engine's sampling); frames given
        decoded are sampled as the model's video processor samples them."""
        sampling = sampling or self.sampling
        if not is_encoded(source):
            frames = checked_frames(source, sampling.fps or DEFAULT_FRAMES_FPS, self.limits)
            return sampling.sample_frames(frames)
        return decode_video(self.read(source), sampling, self.limits)
