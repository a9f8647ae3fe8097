"""The video side of ``InputProcessor``: which models take videos, how many per prompt, the
video processor settings per merged ``mm_processor_kwargs``, and the one place a video is
looked up by its content hash and decoded and preprocessed only on a miss."""

from __future__ import annotations

import threading
from typing import Any

from mmserve.config import ModelConfig
from mmserve.inputs import VideoFrames
from mmserve.multimodal.image.idefics3 import IDEFICS3_ARCHITECTURES, SpannedText, image_seq_len
from mmserve.multimodal.request_kwargs import canonical
from mmserve.multimodal.sampling_keys import without_sampling
from mmserve.multimodal.video.memo import (
    AnyPreparedVideo,
    AnyVideoSettings,
    PreparedVideoMemo,
    VideoLookup,
    hash_encoded_video,
    memo_key,
)
from mmserve.multimodal.video.onevision import (
    ONEVISION_ARCHITECTURE,
    OnevisionVideoSettings,
    checked_onevision_video,
    hash_onevision_video,
    load_onevision_video_settings,
    preprocessed_onevision,
)
from mmserve.multimodal.video.prep import checked_video, hash_video, preprocessed
from mmserve.multimodal.video.qwen2_vl import (
    VIDEO_ARCHITECTURES,
    load_video_settings,
)
from mmserve.multimodal.video.qwen3 import (
    QWEN3_VL_ARCHITECTURE,
    Qwen3VideoSampling,
    load_qwen3_video_settings,
)
from mmserve.multimodal.video.sampling import VideoSampling
from mmserve.multimodal.video.smolvlm import (
    SmolVideoSampling,
    SmolVideoSettings,
    declares_video,
    load_smolvlm_video_settings,
)
from mmserve.multimodal.video.smolvlm_prep import (
    PreparedSmolVideo,
    checked_smolvlm_video,
    hash_smolvlm_video,
    preprocessed_smolvlm,
    spanned_video,
)
from mmserve.multimodal.video.source import VideoLoader, is_encoded


def checkpoint_sampling(model_config: ModelConfig, image_processor: Any) -> VideoSampling:
    """The model's frame sampling (its family's rule, the checkpoint's settings, the engine's
    ``--mm-processor-kwargs``)."""
    cls: type[VideoSampling] = VideoSampling
    if model_config.architecture == QWEN3_VL_ARCHITECTURE:
        cls = Qwen3VideoSampling
    elif model_config.architecture in IDEFICS3_ARCHITECTURES:
        cls = SmolVideoSampling
    return cls.from_checkpoint(model_config.path, image_processor, model_config.processor_kwargs)


class VideoInputs:
    """Video admission for one model: the placeholder token, the per-prompt limit, settings.

    Invariant: settings are loaded once per distinct merged kwargs (the engine's when a request
    gives none) and are immutable, so concurrent admission threads share them; ``memo`` is the
    only memo of videos, keyed by tenant salt + the content hash (``video.memo``), which
    includes those settings and the frame sampling.
    """

    def __init__(self, model_config: ModelConfig, max_videos: int, loader: VideoLoader) -> None:
        """``loader``: reads, decodes and samples videos (the engine's sampling)."""
        self.model_config = model_config
        self.loader = loader
        self.max_videos = max_videos
        self.onevision = model_config.architecture == ONEVISION_ARCHITECTURE
        self.smolvlm = model_config.architecture in IDEFICS3_ARCHITECTURES and declares_video(
            model_config.path
        )  # SmolVLM2: videos written as text (``spanned``), no video token
        self.accepted = (
            model_config.architecture in VIDEO_ARCHITECTURES or self.onevision or self.smolvlm
        )
        self.token_id: int | None = (
            getattr(model_config.hf_config, "video_token_id", None) if self.accepted else None
        )
        self._settings: dict[str, AnyVideoSettings] = {}
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

    def settings(self, merged_kwargs: dict[str, Any] | None = None) -> AnyVideoSettings:
        """Settings of the engine's processor kwargs, or of ``merged_kwargs`` when given."""
        mc = self.model_config
        kwargs = mc.processor_kwargs if merged_kwargs is None else merged_kwargs
        kwargs = without_sampling(kwargs)  # fps & co. pick frames: one setting for all values
        key = canonical(kwargs)
        with self._lock:
            found: AnyVideoSettings | None = self._settings.get(key)
        if found is None:
            if self.onevision:
                found = load_onevision_video_settings(mc.path, mc.hf_config, kwargs)
            elif self.smolvlm:
                seq = image_seq_len(mc.hf_config)
                found = load_smolvlm_video_settings(mc.path, mc.hf_config, seq, kwargs)
            else:
                qwen3 = mc.architecture == QWEN3_VL_ARCHITECTURE
                found = (load_qwen3_video_settings if qwen3 else load_video_settings)(
                    mc.path, kwargs
                )
            with self._lock:
                self._settings[key] = found
        return found

    def load(self, source: Any, merged_kwargs: dict[str, Any] | None = None) -> VideoFrames:
        """Read, decode and sample one video (no memo): the frames the model would see."""
        return self.loader.load(source, self.loader.sampling_for(merged_kwargs))

    def lookup(
        self,
        source: Any,
        merged_kwargs: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> VideoLookup:
        """Read (encoded) or sample and check (frames given) one video, hash its content once
        and look it up in the memo. Blocking (reads files); thread-safe."""
        if not self.accepted:
            raise ValueError("this model does not accept videos")
        settings = self.settings(merged_kwargs)
        sampling = self.loader.sampling_for(merged_kwargs)
        data, frames = None, None
        if is_encoded(source):
            data = self.loader.read(source)
            mm_hash = hash_encoded_video(data, self.model_config.model, settings, sampling)
        else:
            frames = self._checked(self.loader.load(source, sampling), settings)
            if isinstance(settings, OnevisionVideoSettings):
                mm_hash = hash_onevision_video(frames, self.model_config.model, settings)
            elif isinstance(settings, SmolVideoSettings):
                mm_hash = hash_smolvlm_video(frames, self.model_config.model, settings)
            else:
                mm_hash = hash_video(frames, self.model_config.model, settings)
        key = memo_key(mm_hash, cache_salt)
        return VideoLookup(mm_hash, key, settings, sampling, self.memo.get(key), data, frames)

    def decode(self, look: VideoLookup) -> VideoFrames:
        """A memo miss's encoded bytes decoded and sampled in this process."""
        assert look.data is not None
        return self.loader.load(look.data, look.sampling)

    def finish(self, look: VideoLookup, frames: VideoFrames) -> AnyPreparedVideo:
        """Check and preprocess a memo miss's decoded frames under its content hash; memoized."""
        frames = self._checked(frames, look.settings)
        if isinstance(look.settings, OnevisionVideoSettings):
            prepared: AnyPreparedVideo = preprocessed_onevision(frames, look.mm_hash, look.settings)
        elif isinstance(look.settings, SmolVideoSettings):
            prepared = preprocessed_smolvlm(frames, look.mm_hash, look.settings)
        else:
            prepared = preprocessed(frames, look.mm_hash, look.settings)
        self.memo.put(look.key, prepared)
        return prepared

    def prepare(
        self,
        source: Any,
        merged_kwargs: dict[str, Any] | None = None,
        cache_salt: str | None = None,
    ) -> AnyPreparedVideo:
        """Look up (``lookup``), and on a miss decode (``decode``) and preprocess (``finish``)
        one video of any ``video.source`` input. ValueError for a video this model cannot take
        or whose placeholders alone would not leave room for one generated token within
        ``max_model_len``. Thread-safe; blocking (never call it on the event loop)."""
        look = self.lookup(source, merged_kwargs, cache_salt)
        if look.hit is not None:
            return look.hit
        return self.finish(look, look.frames if look.frames is not None else self.decode(look))

    def _checked(self, frames: VideoFrames, settings: AnyVideoSettings) -> VideoFrames:
        """``frames`` (sampled: every frame is used), refused when their placeholders alone
        exceed ``max_model_len - 1``."""
        max_tokens = self.model_config.max_model_len - 1
        if isinstance(settings, OnevisionVideoSettings):
            return checked_onevision_video(frames, settings, max_tokens)
        if isinstance(settings, SmolVideoSettings):
            return checked_smolvlm_video(frames, settings, max_tokens)
        return checked_video(frames, settings, max_tokens)

    def spanned(
        self, videos: list[Any], merged_kwargs: dict[str, Any] | None, cache_salt: str | None
    ) -> list[SpannedText]:
        """SmolVLM2: each video (prepared here unless given as a ``PreparedSmolVideo``) as the
        text its processor writes and the one item over its frames."""
        texts = []
        for i, video in enumerate(videos):
            if not isinstance(video, PreparedSmolVideo):
                video = self.prepare(video, merged_kwargs, cache_salt)
            if not isinstance(video, PreparedSmolVideo):
                raise ValueError(f"video {i} was prepared for another model family")
            texts.append(spanned_video(video, i, cache_salt))
        return texts
