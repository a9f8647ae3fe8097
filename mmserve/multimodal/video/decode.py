"""Decode a video from encoded bytes with PyAV into the sampled RGB frames (``VideoFrames``).

Only the demuxers of ordinary container files are allowed (mp4/mov, Matroska/WebM, AVI, MPEG-TS,
FLV, Ogg): playlist and concat formats, which make FFmpeg open further files or URLs, are
refused (``format_whitelist``), and nested opens through the demuxer's I/O callback fail.
Frames are decoded in order up to the last sampled one; only the sampled ones are converted to
RGB. Every limit is checked before the work
it bounds, where the container says enough, and again while decoding, where it may lie.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np

from mmserve.inputs import VideoFrames
from mmserve.multimodal.media.limits import VideoTooLargeError
from mmserve.multimodal.video.sampling import VideoSampling, sampled_timing

#: demuxers that read one self-contained file (no playlists, no references to other files)
ALLOWED_DEMUXERS = "mov,mp4,matroska,webm,avi,mpegts,flv,ogg"


@dataclass(frozen=True)
class VideoLimits:
    """Bounds on the work and memory one video may cost.

    ``max_frame_pixels``: width x height of a frame (default 4K UHD); ``max_frames``: frames the
    container may hold (all are demuxed and, up to the last sampled one, decoded);
    ``max_duration_s``: length of the video; ``max_output_bytes``: the sampled RGB frames
    together; ``max_decode_s``: wall-clock time of one decode.
    """

    max_frame_pixels: int = 3840 * 2160
    max_frames: int = 100_000
    max_duration_s: float = 3600.0
    max_output_bytes: int = 512 << 20
    max_decode_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_frame_pixels", "max_frames", "max_output_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"video limit {name} must be a positive integer, got {value!r}")
        for name in ("max_duration_s", "max_decode_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"video limit {name} must be positive seconds, got {value!r}")


def _refuse_nested_open(url: str, flags: int, options: dict[str, Any]) -> Any:
    raise PermissionError("a video container may not open other files or URLs")


def _open(data: bytes) -> Any:
    try:
        return av.open(
            io.BytesIO(data),
            options={"format_whitelist": ALLOWED_DEMUXERS},
            io_open=_refuse_nested_open,
            metadata_errors="replace",
        )
    except (av.FFmpegError, OSError, ValueError, UnicodeError):
        raise ValueError(
            "could not decode the video (corrupt or not a supported container format)"
        ) from None


def _frame_rate(stream: Any) -> float:
    rate = stream.average_rate or stream.guessed_rate
    if not isinstance(rate, Fraction) or rate <= 0:
        raise ValueError("could not decode the video (its frame rate is unknown)")
    return float(rate)


def _count_frames(container: Any, stream: Any, limits: VideoLimits, deadline: float) -> int:
    """The stream's frame count from its header, else from its packets (demuxed, not
    decoded)."""
    if stream.frames > 0:
        return int(stream.frames)
    count = 0
    for packet in container.demux(stream):
        if packet.size:
            count += 1
        if count > limits.max_frames:
            raise VideoTooLargeError(f"video has more than {limits.max_frames} frames")
        if time.monotonic() > deadline:
            raise VideoTooLargeError(
                f"video decoding exceeded its time limit of {limits.max_decode_s:g} s"
            )
    return count


def _check_header(
    stream: Any, total: int, video_fps: float, count: int, limits: VideoLimits
) -> tuple[int, int]:
    width, height = stream.codec_context.width, stream.codec_context.height
    if width < 1 or height < 1:
        raise ValueError(f"video has zero size {width}x{height}")
    if width * height > limits.max_frame_pixels:
        raise VideoTooLargeError(
            f"video frames of {width}x{height} pixels exceed the limit of"
            f" {limits.max_frame_pixels} pixels"
        )
    if total > limits.max_frames:
        raise VideoTooLargeError(f"video has {total} frames, more than {limits.max_frames}")
    if total / video_fps > limits.max_duration_s:
        raise VideoTooLargeError(
            f"video lasts {total / video_fps:.1f} s, more than {limits.max_duration_s:g} s"
        )
    output = count * width * height * 3
    if output > limits.max_output_bytes:
        raise VideoTooLargeError(
            f"{count} sampled frames of {width}x{height} take {output} bytes, more than"
            f" {limits.max_output_bytes}; lower fps, num_frames or max_frames"
        )
    return width, height


def decode_video(
    data: bytes, sampling: VideoSampling, limits: VideoLimits | None = None
) -> VideoFrames:
    """The frames ``sampling`` picks from the first video stream of ``data``, as a
    ``[T, H, W, 3]`` uint8 array, with the sampled rate and each frame's time; ValueError
    (``VideoTooLargeError`` for limits) saying what is wrong."""
    limits = limits or VideoLimits()
    if not data:
        raise ValueError("video data is empty")
    deadline = time.monotonic() + limits.max_decode_s
    try:
        with _open(data) as container:
            total = _count_frames(container, _video_stream(container), limits, deadline)
            if container.streams.video[0].frames > 0:
                return _decode(container, total, sampling, limits, deadline)
        with _open(data) as container:  # its packets were read to count them: start over
            return _decode(container, total, sampling, limits, deadline)
    except (av.FFmpegError, OSError, MemoryError):
        raise ValueError("could not decode the video (corrupt or truncated)") from None


def _video_stream(container: Any) -> Any:
    if not container.streams.video:
        raise ValueError("could not decode the video (it has no video stream)")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        raise ValueError("could not decode the video (no decoder for its codec)")
    return stream


def _decode(
    container: Any, total: int, sampling: VideoSampling, limits: VideoLimits, deadline: float
) -> VideoFrames:
    stream = _video_stream(container)
    video_fps = _frame_rate(stream)
    indices = sampling.indices(total, video_fps)
    width, height = _check_header(stream, total, video_fps, len(indices), limits)
    wanted = set(indices)
    out = np.empty((len(indices), height, width, 3), dtype=np.uint8)
    filled, decoded = 0, 0
    for frame in container.decode(stream):
        if time.monotonic() > deadline:
            raise VideoTooLargeError(
                f"video decoding exceeded its time limit of {limits.max_decode_s:g} s"
            )
        if frame.width * frame.height > limits.max_frame_pixels:
            raise VideoTooLargeError(
                f"a video frame of {frame.width}x{frame.height} pixels exceeds the limit of"
                f" {limits.max_frame_pixels} pixels"
            )
        if decoded in wanted:  # frames changing size mid-stream are scaled to the first size
            out[filled] = frame.to_ndarray(format="rgb24", width=width, height=height)
            filled += 1
        decoded += 1
        if filled == len(indices):
            break
    if filled < len(indices):
        raise ValueError(
            f"could not decode the video (its stream ended after {decoded} of {total} frames:"
            " truncated or corrupt)"
        )
    rate, timestamps = sampled_timing(indices, total, video_fps)
    duration = float(total / (stream.average_rate or stream.guessed_rate))
    return VideoFrames(out, rate, timestamps, duration)
