"""The video sampling keys of ``mm_processor_kwargs``: merged like the others, but they change
which frames a video gives, never an image, so everything about images leaves them out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VIDEO_KWARGS = ("fps", "num_frames", "min_frames", "max_frames", "do_sample_frames")


def without_sampling(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the video sampling keys (what the image and video processors read)."""
    return {k: v for k, v in kwargs.items() if k not in VIDEO_KWARGS}
