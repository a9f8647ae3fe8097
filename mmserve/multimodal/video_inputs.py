"""The video side of ``InputProcessor``: which models take videos, how many per prompt, and the
video processor settings per merged ``mm_processor_kwargs``."""

from __future__ import annotations

import threading
from typing import Any

from mmserve.config import ModelConfig
from mmserve.multimodal.request_kwargs import canonical
from mmserve.multimodal.video_prep import PreparedVideo, prepare_video
from mmserve.multimodal.video_processing import (
    VIDEO_ARCHITECTURES,
    VideoSettings,
    load_video_settings,
)


class VideoInputs:
    """Video admission for one model: the placeholder token, the per-prompt limit, settings.

    Invariant: settings are loaded once per distinct merged kwargs (the engine's when a request
    gives none) and are immutable, so concurrent admission threads share them.
    """

    def __init__(self, model_config: ModelConfig, max_videos: int) -> None:
        self.model_config = model_config
        self.max_videos = max_videos
        self.accepted = model_config.architecture in VIDEO_ARCHITECTURES
        self.token_id: int | None = (
            getattr(model_config.hf_config, "video_token_id", None) if self.accepted else None
        )
        self._settings: dict[str, VideoSettings] = {}
        self._lock = threading.Lock()

    def check_count(self, count: int) -> None:
        if count and not self.accepted:
            raise ValueError("this model does not accept videos")
        if count > self.max_videos:
            raise ValueError(
                f"{count} videos exceed the limit of {self.max_videos} per prompt"
                " (limit_mm_per_prompt)"
            )

    def settings(self, merged_kwargs: dict[str, Any] | None = None) -> VideoSettings:
        """Settings of the engine's processor kwargs, or of ``merged_kwargs`` when given."""
        mc = self.model_config
        kwargs = mc.processor_kwargs if merged_kwargs is None else merged_kwargs
        key = canonical(kwargs)
        with self._lock:
            found = self._settings.get(key)
        if found is None:
            found = load_video_settings(mc.path, kwargs)
            with self._lock:
                self._settings[key] = found
        return found

    def prepare(self, video: Any, merged_kwargs: dict[str, Any] | None = None) -> PreparedVideo:
        """ValueError for a video this model cannot take or whose placeholders alone would
        not leave room for one generated token within ``max_model_len``."""
        if not self.accepted:
            raise ValueError("this model does not accept videos")
        mc = self.model_config
        return prepare_video(video, mc.model, self.settings(merged_kwargs), mc.max_model_len - 1)
