"""The video side of ``InputProcessor``: which models take videos, how many per prompt, and the
video processor settings per merged ``mm_processor_kwargs``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from mmserve.config import ModelConfig
from mmserve.multimodal.image_memo import DEFAULT_MEMO_BYTES
from mmserve.multimodal.onevision_video import (
    ONEVISION_ARCHITECTURE,
    OnevisionVideoSettings,
    PreparedOnevisionVideo,
    checked_onevision_video,
    hash_onevision_video,
    load_onevision_video_settings,
    preprocessed_onevision,
)
from mmserve.multimodal.qwen3_video import QWEN3_VL_ARCHITECTURE, load_qwen3_video_settings
from mmserve.multimodal.request_kwargs import canonical
from mmserve.multimodal.video_prep import PreparedVideo, checked_video, hash_video, preprocessed
from mmserve.multimodal.video_processing import (
    VIDEO_ARCHITECTURES,
    VideoSettings,
    load_video_settings,
)
from mmserve.multimodal.video_sampling import without_sampling

AnyPreparedVideo = PreparedVideo | PreparedOnevisionVideo


class VideoInputs:
    """Video admission for one model: the placeholder token, the per-prompt limit, settings.

    Invariant: settings are loaded once per distinct merged kwargs (the engine's when a request
    gives none) and are immutable, so concurrent admission threads share them; the memo's keys
    are content hashes that include those settings.
    """

    def __init__(self, model_config: ModelConfig, max_videos: int) -> None:
        self.model_config = model_config
        self.max_videos = max_videos
        self.onevision = model_config.architecture == ONEVISION_ARCHITECTURE
        self.accepted = model_config.architecture in VIDEO_ARCHITECTURES or self.onevision
        self.token_id: int | None = (
            getattr(model_config.hf_config, "video_token_id", None) if self.accepted else None
        )
        self._settings: dict[str, VideoSettings | OnevisionVideoSettings] = {}
        self.memo = PreparedVideoMemo()
        self._lock = threading.Lock()

    def check_count(self, count: int) -> None:
        if count and not self.accepted:
            raise ValueError("this model does not accept videos")
        if count > self.max_videos:
            raise ValueError(
                f"{count} videos exceed the limit of {self.max_videos} per prompt"
                " (limit_mm_per_prompt)"
            )

    def settings(
        self, merged_kwargs: dict[str, Any] | None = None
    ) -> VideoSettings | OnevisionVideoSettings:
        """Settings of the engine's processor kwargs, or of ``merged_kwargs`` when given."""
        mc = self.model_config
        kwargs = mc.processor_kwargs if merged_kwargs is None else merged_kwargs
        kwargs = without_sampling(kwargs)  # fps & co. pick frames: one setting for all values
        key = canonical(kwargs)
        with self._lock:
            found = self._settings.get(key)
        if found is None:
            if self.onevision:
                found = load_onevision_video_settings(mc.path, mc.hf_config, kwargs)
            else:
                qwen3 = mc.architecture == QWEN3_VL_ARCHITECTURE
                found = (load_qwen3_video_settings if qwen3 else load_video_settings)(
                    mc.path, kwargs
                )
            with self._lock:
                self._settings[key] = found
        return found

    def prepare(
        self,
        video: Any,
        merged_kwargs: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> AnyPreparedVideo:
        """ValueError for a video this model cannot take or whose placeholders alone would
        not leave room for one generated token within ``max_model_len``. The same frames sent
        again (a chat's next turn) by the same tenant are hashed, not preprocessed again."""
        if not self.accepted:
            raise ValueError("this model does not accept videos")
        mc = self.model_config
        settings = self.settings(merged_kwargs)
        if isinstance(settings, OnevisionVideoSettings):
            frames = checked_onevision_video(video, settings, mc.max_model_len - 1)
            mm_hash = hash_onevision_video(frames, mc.model, settings)
        else:
            frames = checked_video(video, settings, mc.max_model_len - 1)
            mm_hash = hash_video(frames, mc.model, settings)
        key = f"{cache_salt or ''}|{mm_hash}"
        prepared = self.memo.get(key)
        if prepared is None:
            if isinstance(settings, OnevisionVideoSettings):
                prepared = preprocessed_onevision(frames, mm_hash, settings)
            else:
                prepared = preprocessed(frames, mm_hash, settings)
            self.memo.put(key, prepared)
        return prepared


class PreparedVideoMemo:
    """LRU of ``PreparedVideo`` by tenant salt + content hash.

    Invariants: the summed ``pixel_values`` bytes held stay <= ``max_bytes`` (least recently
    used first out; a larger video is not held); safe from several admission threads.
    """

    def __init__(self, max_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, AnyPreparedVideo] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, key: str) -> AnyPreparedVideo | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return found

    def put(self, key: str, prepared: AnyPreparedVideo) -> None:
        size = prepared.pixel_values.nbytes
        with self._lock:
            if size > self.max_bytes or key in self._entries:
                return
            self._entries[key] = prepared
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.pixel_values.nbytes
