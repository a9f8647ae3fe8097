"""Prompt + images + videos -> token ids with expanded placeholders and per-item (hash, offset,
length): one item per image, one per video frame group."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import blake3
import numpy as np
from PIL import Image

from mmserve.config import ModelConfig
from mmserve.inputs import MultiModalItem, ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import MediaHandleError, is_handle
from mmserve.multimodal.hashing import hash_uuid, multi_image_hash, salted
from mmserve.multimodal.image.idefics3 import TiledImageExpander
from mmserve.multimodal.image.memo import PreparedImage, ProcessedImageMemo
from mmserve.multimodal.image.prep import DecodedPixels, ImagePreparer
from mmserve.multimodal.image.text_expansion import ImageTextExpander
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.placeholders import placeholder_places, spliced
from mmserve.multimodal.request_kwargs import (
    PreparerCache,
    canonical,
    check_request_kwargs,
    image_kwargs,
)
from mmserve.multimodal.sampling_keys import without_sampling
from mmserve.multimodal.video.inputs import VideoInputs, checkpoint_sampling
from mmserve.multimodal.video.memo import AnyPreparedVideo
from mmserve.multimodal.video.onevision import PreparedOnevisionVideo
from mmserve.multimodal.video.prep import PreparedVideo
from mmserve.multimodal.video.qwen3 import timestamp_tokens
from mmserve.multimodal.video.source import VideoLoader


class InputProcessor:
    """Tokenizes, loads and hashes images, runs the HF image processor, expands placeholders.

    Runs at admission (off the event loop in the server), so every image is hashed exactly once.
    A request's ``mm_kwargs`` (``mm_processor_kwargs``) select the preparer of its merged
    processor settings (``request_kwargs``); the memo and the item keys include them. The images
    of a prompt are one sample, as to the model's processor: with several, a family with a
    multi-image mode prepares each in it (``ImagePreparer.multi_image``); the memo and item
    keys include the mode.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: Any,
        image_processor: Any,
        max_images: int,
        media_policy: MediaFetchPolicy,
        load_image_processor: Callable[[dict[str, Any]], Any] | None = None,
        max_videos: int = 0,
    ) -> None:
        """``load_image_processor``: merged processor kwargs -> image processor (needed for
        per-request ``mm_processor_kwargs``); ``max_videos``: videos per prompt."""
        self.model_config = model_config
        self.hf_config = model_config.hf_config
        self.tokenizer = tokenizer
        self.max_images = max_images
        self.preparer = ImagePreparer(model_config, image_processor, media_policy)
        self.preparers = PreparerCache(self.preparer, load_image_processor or _no_loader)
        self.memo = ProcessedImageMemo()
        sampling = checkpoint_sampling(model_config, image_processor)
        self.video_loader = VideoLoader(media_policy, sampling)
        self.videos = VideoInputs(model_config, max_videos, self.video_loader)
        glue = self.preparer.image_inputs
        self.image_text_expander: ImageTextExpander | TiledImageExpander | None = None
        if glue and glue.image_text:
            image_text = glue.image_text(tokenizer, model_config)
            self.image_text_expander = ImageTextExpander(
                image_text, tokenizer, self.tokenize, model_config.image_token_id
            )
        elif glue and glue.tiled_text:
            self.image_text_expander = TiledImageExpander(
                tokenizer, self.tokenize, model_config, self.videos.smolvlm
            )

    @property
    def media_policy(self) -> MediaFetchPolicy:
        return self.preparer.media_policy

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        ids = [int(t) for t in prompt]
        vocab = self.model_config.hf_config.text_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        return ids

    def process(self, prompt: PromptInput) -> ProcessedPrompt:
        """Token ids with expanded placeholders, one item per image and one per video frame
        group. ``prompt.images`` may hold ``PreparedImage``s (from ``prepare_image`` with the
        same ``mm_processor_kwargs`` and ``preparer.multi_image(len(images))``, e.g. run in
        another thread) or sources; ``prompt.videos`` ``PreparedVideo``s (``prepare_video``)
        or decoded videos. ``prompt.cache_salt`` scopes the item keys (it is not checked
        here: ``prompt_limits.checked_prompt`` does, around this call)."""
        images, uuids, videos = prompt.images, prompt.uuids, prompt.videos
        cache_salt, mm_kwargs = prompt.cache_salt, prompt.mm_processor_kwargs
        merged = self.check_mm_kwargs(mm_kwargs)
        self.videos.check_count(len(videos))  # a ValueError for models without video input
        if self.image_text_expander is not None:
            return self._process_image_text(prompt, merged)
        ids = np.asarray(self.tokenize(prompt.prompt), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("prompt is empty")
        places = placeholder_places(ids, self.model_config.image_token_id, len(images), "image")
        video_places = placeholder_places(ids, self.videos.token_id, len(videos), "video")
        self.check_num_images(len(images))
        if uuids is not None and len(uuids) != len(images):
            raise ValueError(f"got {len(uuids)} uuids for {len(images)} images")
        if not len(images) and not len(videos):
            return ProcessedPrompt(ids.tolist(), [])
        order = sorted([(int(p), i, False) for i, p in enumerate(places)] + [
            (int(p), i, True) for i, p in enumerate(video_places)
        ])  # fmt: skip
        expansions: list[np.ndarray] = []
        items: list[MultiModalItem] = []
        shift = 0
        for place, i, is_video in order:
            expansion = None
            if is_video:
                video = videos[i]
                if not isinstance(video, (PreparedVideo, PreparedOnevisionVideo)):
                    video = self.videos.prepare(video, merged, cache_salt)
                starts = None
                if isinstance(video, PreparedVideo) and video.timestamps:  # Qwen3-VL: "<t seconds>"
                    expansion, starts = timestamp_tokens(
                        video.timestamps, video.group_length, self.tokenizer, self.hf_config
                    )
                items += video.items(place + shift, cache_salt, starts)
                length = video.length if expansion is None else len(expansion)
            else:
                prepared = self._prepared(images[i], len(images), cache_salt, mm_kwargs)
                uuid = uuids[i] if uuids is not None else None
                key = self.item_key(prepared, uuid, cache_salt, merged)
                length = prepared.length
                items.append(MultiModalItem(key, place + shift, length, prepared.data))
            expansions.append(np.full(length, ids[place]) if expansion is None else expansion)
            shift += length - 1
        return ProcessedPrompt(spliced(ids, [p for p, _, _ in order], expansions), items)

    def prepare_video(
        self, video: Any, mm_kwargs: Any = None, cache_salt: str | None = None
    ) -> AnyPreparedVideo:
        """Read, decode, sample, hash and preprocess one video (any ``video_source`` input)
        with the prompt's processor settings, or take it from the memo by its content hash
        (per tenant). Thread-safe; blocking (never call it on the event loop)."""
        return self.videos.prepare(video, self.check_mm_kwargs(mm_kwargs), cache_salt)

    def _process_image_text(
        self, prompt: PromptInput, merged: dict[str, Any] | None
    ) -> ProcessedPrompt:
        """Families whose processor expands the image marker in the text (``ImageText``;
        SmolVLM's tiles, SmolVLM2's videos): the images and videos are checked and prepared
        here, the prompt built by ``ImageTextExpander`` (``TiledImageExpander``)."""
        assert self.image_text_expander is not None
        images, uuids, cache_salt = prompt.images, prompt.uuids, prompt.cache_salt
        self.check_num_images(len(images))
        if uuids is not None and len(uuids) != len(images):
            raise ValueError(f"got {len(uuids)} uuids for {len(images)} images")
        self.image_text_expander.check_marker_count(prompt.prompt, len(images))
        mm_kwargs = prompt.mm_processor_kwargs
        prepared = [self._prepared(s, len(images), cache_salt, mm_kwargs) for s in images]

        def key_of(i: int, image: PreparedImage) -> str:
            return self.item_key(image, uuids[i] if uuids is not None else None, cache_salt, merged)

        if not isinstance(self.image_text_expander, TiledImageExpander):
            return self.image_text_expander.expand(prompt.prompt, prepared, key_of)
        videos = self.videos.spanned(list(prompt.videos), merged, cache_salt)
        return self.image_text_expander.expand(prompt.prompt, prepared, key_of, videos)

    def _prepared(
        self, image: Any, num_images: int, cache_salt: str | None, mm_kwargs: Any
    ) -> PreparedImage:
        """One of a prompt's ``num_images`` images, prepared for that count (a
        ``PreparedImage`` of the other mode is a ValueError: its data would not fit)."""
        multi_image = self.preparer.multi_image(num_images)
        if is_handle(image):  # the engine's intake resolves them; the Ray ingress cannot
            raise MediaHandleError(
                "media handles and image uuids without data are resolved by the engine's own"
                " admission; send the image itself here",
                "media_handle_unsupported",
            )
        if not isinstance(image, PreparedImage):
            return self.prepare_image(image, cache_salt, mm_kwargs, multi_image)
        if image.multi_image != multi_image:
            raise ValueError(
                f"an image prepared with multi_image={image.multi_image} given to a prompt"
                f" of {num_images} images, which takes multi_image={multi_image}"
            )
        return image

    def check_num_images(self, count: int) -> None:
        if count and not self.preparer.accepts_images:
            raise ValueError("this model does not accept images")
        if count > self.max_images:
            raise ValueError(
                f"{count} images exceed the limit of {self.max_images} per prompt"
                " (limit_mm_per_prompt)"
            )

    def check_mm_kwargs(self, mm_kwargs: Any) -> dict[str, Any] | None:
        """A request's ``mm_processor_kwargs`` merged over the engine's, or None when they
        change nothing; ValueError naming the field for bad keys or values."""
        mc = self.model_config
        merged = check_request_kwargs(mc.architecture, mc.processor_kwargs, mm_kwargs)
        if merged is not None and self.videos.accepted:
            self.video_loader.sampling_for(merged)  # checks the video settings they make
        return merged

    def image_kwargs(self, mm_kwargs: Any) -> dict[str, Any] | None:
        """The image processor's settings of a request's ``mm_processor_kwargs`` (checked;
        video sampling keys left out), or None when they are the engine's."""
        merged = self.check_mm_kwargs(mm_kwargs)
        return image_kwargs(self.model_config.processor_kwargs, merged)

    def item_key(
        self,
        prepared: PreparedImage,
        uuid: str | None,
        cache_salt: str | None,
        merged_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The encoder-cache key: content hash, or the caller's uuid bound to the image's size
        and token count (and the image processor's kwargs); either marked with the
        multi-image mode where the image was prepared in it and scoped by the tenant's
        ``cache_salt``."""
        mm_hash = self.base_hash(prepared, uuid, merged_kwargs)
        if prepared.multi_image:
            mm_hash = multi_image_hash(mm_hash)
        return salted(mm_hash, cache_salt)

    def base_hash(
        self, prepared: PreparedImage, uuid: str | None, merged_kwargs: dict[str, Any] | None
    ) -> str:
        """The hash ``item_key`` marks and salts: the content hash, or the caller's uuid bound
        to the image's size and token count (and the image processor's kwargs)."""
        if uuid is None:
            return prepared.mm_hash
        mc = self.model_config
        kwargs = mc.processor_kwargs if merged_kwargs is None else merged_kwargs
        kwargs = without_sampling(kwargs)
        return hash_uuid(uuid, mc.model, kwargs, prepared.length, prepared.size)

    def prepare_image(
        self,
        source: Any,
        cache_salt: str | None = None,
        mm_kwargs: Any = None,
        multi_image: bool = False,
    ) -> PreparedImage:
        """Decode, hash and preprocess one image (in the multi-image mode if asked:
        ``ImagePreparer.multi_image``), or take all three from the memo when these exact bytes
        (or pixels) were seen before by the same tenant with the same processor settings and
        mode. Thread-safe."""
        if not self.preparer.accepts_images:
            raise ValueError("this model does not accept images")
        merged = self.image_kwargs(mm_kwargs)
        preparer = self.preparers.get(merged)
        raw = preparer.read(source)
        decoded: DecodedPixels | None = None
        if isinstance(raw, Image.Image):  # keyed by its content hash, which preparing reuses
            decoded = preparer.decoded_pixels(raw)
            mode = "multi|" if multi_image else ""
            key = f"{cache_salt or ''}|{mode}px:{decoded.mm_hash}"
        else:
            key = memo_key(raw, cache_salt, merged, multi_image)
        prepared = self.memo.get(key)
        if prepared is None:
            prepared = preparer.prepare(raw if decoded is None else decoded, multi_image)
            self.memo.put(key, prepared)
        return prepared


def memo_key(
    raw: bytes | str,
    cache_salt: str | None = None,
    merged_kwargs: dict[str, Any] | None = None,
    multi_image: bool = False,
) -> str:
    """The memo key of encoded image bytes (or of a data URL, before decoding it), per tenant,
    per image processor setting (``image_kwargs``; None: the engine's) and per mode."""
    kind, data = ("url", raw.encode()) if isinstance(raw, str) else ("raw", raw)
    setting = "" if merged_kwargs is None else canonical(merged_kwargs)
    mode = "multi|" if multi_image else ""
    return f"{cache_salt or ''}|{setting}|{mode}{kind}:{blake3.blake3(data).hexdigest()}"


def _no_loader(kwargs: dict[str, Any]) -> Any:
    raise ValueError("per-request mm_processor_kwargs need an image processor loader")
