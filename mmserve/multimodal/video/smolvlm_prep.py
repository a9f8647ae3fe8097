"""One SmolVLM2 video -> ``PreparedSmolVideo`` -> its prompt text and ONE encoder item.

``SmolVLMProcessor.replace_video_token`` writes a video, in place of its ``<video>`` marker::

    You are provided the following series of {frame count in words} frames from a {H:MM:SS}
    [H:MM:SS] video.\\n
    \\nFrame from MM:SS:<fake_token_around_image><global-img><image>*L<fake_token_around_image>
    ... (each frame: its time, then its text as an unsplit image)
    \\n\\n

Every frame is one tile of ``L`` embeddings (the model encodes it as an image). The video is
one ``MultiModalItem`` whose range runs from the first frame's ``<fake_token_around_image>`` to
the last frame's (``SpannedText``): the frame embeddings at its ``<image>`` positions, the
text embeddings of the tags and of the later frames' timestamps between them. The intro, the
first timestamp and the outro lie outside it (ordinary prompt text, tokenized with their
neighbours). Its key is the video's content hash, which covers the model, the processor
settings and the frame sampling (``video.memo``), so one video is one encoder-cache entry per
sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import blake3
import numpy as np
from num2words import num2words

from mmserve.inputs import VideoFrames, VideoGroup
from mmserve.multimodal.hashing import salted
from mmserve.multimodal.image.idefics3 import VIDEO, SpannedText, tile_text
from mmserve.multimodal.video.prep import video_frames
from mmserve.multimodal.video.smolvlm import SmolVideoSettings, preprocess_smolvlm_video

# SmolVLMProcessor's texts (transformers.models.smolvlm.processing_smolvlm)
VIDEO_INTRO = (
    "You are provided the following series of {frame_count} frames from a {video_duration}"
    " [H:MM:SS] video.\n"
)
MEDIA_OUTTRO = "\n\n"
FRAME_TIMESTAMP = "\nFrame from {timestamp}:"


@dataclass(frozen=True)
class PreparedSmolVideo:
    """A preprocessed SmolVLM2 video: its content hash, ``pixel_values`` (one tile a frame),
    each frame's time and the video's duration in seconds."""

    mm_hash: str
    pixel_values: np.ndarray  # [T, 3, S, S] float32
    timestamps: tuple[float, ...]
    duration: float | None
    frame_tokens: int
    seconds_per_frame: float


def video_text(
    timestamps: tuple[float, ...], duration: float | None, frame_tokens: int
) -> tuple[str, str]:
    """(the text ``SmolVLMProcessor`` writes for a video, the part its item spans)."""
    seconds = int(duration) if duration is not None else int(timestamps[-1])
    text = VIDEO_INTRO.format(
        frame_count=num2words(len(timestamps)), video_duration=str(timedelta(seconds=seconds))
    )
    frame = tile_text(0, 0, frame_tokens)
    stamps = [f"{int(t // 60):02d}:{int(t % 60):02d}" for t in timestamps]
    head = FRAME_TIMESTAMP.format(timestamp=stamps[0])
    span = frame + "".join(FRAME_TIMESTAMP.format(timestamp=s) + frame for s in stamps[1:])
    return text + head + span + MEDIA_OUTTRO, span


def spanned_video(prepared: PreparedSmolVideo, index: int, cache_salt: str | None) -> SpannedText:
    """Video ``index`` of a prompt as its text and one item (keyed by its content hash)."""
    text, span = video_text(prepared.timestamps, prepared.duration, prepared.frame_tokens)
    count = len(prepared.pixel_values)
    return SpannedText(
        VIDEO,
        text,
        span,
        salted(prepared.mm_hash, cache_salt),
        {"pixel_values": prepared.pixel_values},
        VideoGroup(0, 1, prepared.seconds_per_frame),
        label=f"video {index}'s text ({count} frames)",
    )


def hash_smolvlm_video(frames: VideoFrames, model_id: str, settings: SmolVideoSettings) -> str:
    """256-bit blake3 of model id, settings, fps, timestamps, duration, shape and pixels."""
    array = np.ascontiguousarray(frames.frames)
    hasher = blake3.blake3(f"smolvlm-video\0{model_id}\0{settings.key()}\0".encode())
    head = f"{frames.fps!r}\0{frames.timestamps!r}\0{frames.duration!r}\0{array.shape}\0"
    hasher.update(head.encode())
    hasher.update(array.data)
    return hasher.hexdigest()


def checked_smolvlm_video(
    video: Any, settings: SmolVideoSettings, max_tokens: int | None
) -> VideoFrames:
    """``video_frames(video)`` (its duration kept), refused (ValueError) when its frames alone
    would exceed ``max_tokens`` (from the frame count, before any preprocessing)."""
    frames = video_frames(video)
    if isinstance(video, VideoFrames) and video.duration is not None:
        frames = VideoFrames(frames.frames, frames.fps, frames.timestamps, video.duration)
    num = frames.frames.shape[0]
    if max_tokens is not None and settings.min_tokens(num) > max_tokens:
        raise ValueError(
            f"a video of {num} frames needs at least {settings.min_tokens(num)} tokens, more"
            f" than max_model_len allows ({max_tokens}): send fewer frames"
        )
    return frames


def preprocessed_smolvlm(
    frames: VideoFrames, mm_hash: str, settings: SmolVideoSettings
) -> PreparedSmolVideo:
    pixel_values = preprocess_smolvlm_video(frames.frames, settings)
    stamps, duration = tuple(frames.timestamps), frames.duration
    return PreparedSmolVideo(
        mm_hash, pixel_values, stamps, duration, settings.frame_tokens, 1 / frames.fps
    )


def max_video_tokens(frame_tokens: int, max_frames: int) -> int:
    """An upper bound of a video's item (its span): per frame ``L + 3`` tokens, per later
    frame at most 20 for its timestamp (``\\nFrame from MM:SS:`` is 18 ASCII characters up to
    99 minutes, each at most one token of a byte-level vocabulary; 20 up to 9999)."""
    return max_frames * (frame_tokens + 3) + (max_frames - 1) * 20
