"""Prompt + images -> token ids with expanded placeholders and per-image (hash, offset, length)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import blake3
import numpy as np
from PIL import Image

from mmserve.config import ModelConfig
from mmserve.inputs import MultiModalItem, ProcessedPrompt
from mmserve.multimodal.hashing import hash_uuid, salted
from mmserve.multimodal.image_memo import PreparedImage, ProcessedImageMemo
from mmserve.multimodal.image_prep import ImagePreparer
from mmserve.multimodal.media import checked_image
from mmserve.multimodal.media_fetch import MediaFetchPolicy


class InputProcessor:
    """Tokenizes, loads and hashes images, runs the HF image processor, expands placeholders.

    Runs at admission (off the event loop in the server), so every image is hashed exactly once.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: Any,
        image_processor: Any,
        max_images: int,
        media_policy: MediaFetchPolicy,
    ) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.max_images = max_images
        self.preparer = ImagePreparer(model_config, image_processor, media_policy)
        self.memo = ProcessedImageMemo()

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

    def process(
        self,
        prompt: str | Sequence[int],
        images: Sequence[Any] = (),
        uuids: Sequence[str | None] | None = None,
        cache_salt: str | None = None,
    ) -> ProcessedPrompt:
        """Token ids with expanded placeholders and one item per image. ``images`` may hold
        ``PreparedImage``s (from ``prepare_image``, e.g. run in another thread) or sources."""
        ids = np.asarray(self.tokenize(prompt), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("prompt is empty")
        image_token = self.model_config.image_token_id
        places = (
            np.flatnonzero(ids == image_token)
            if image_token is not None
            else np.empty(0, dtype=np.int64)
        )
        if len(places) != len(images):
            raise ValueError(
                f"prompt has {len(places)} image placeholder(s) but {len(images)} image(s)"
                " were given"
            )
        self.check_num_images(len(images))
        if uuids is not None and len(uuids) != len(images):
            raise ValueError(f"got {len(uuids)} uuids for {len(images)} images")
        if not len(images):
            return ProcessedPrompt(ids.tolist(), [])
        repeats = np.ones_like(ids)
        items: list[MultiModalItem] = []
        shift = 0
        for i, (place, source) in enumerate(zip(places, images, strict=True)):
            prepared = (
                source
                if isinstance(source, PreparedImage)
                else self.prepare_image(source, cache_salt)
            )
            key = self.item_key(prepared, uuids[i] if uuids is not None else None, cache_salt)
            repeats[place] = prepared.length
            items.append(MultiModalItem(key, int(place) + shift, prepared.length, prepared.data))
            shift += prepared.length - 1
        return ProcessedPrompt(np.repeat(ids, repeats).tolist(), items)

    def check_num_images(self, count: int) -> None:
        if count and not self.preparer.accepts_images:
            raise ValueError("this model does not accept images")
        if count > self.max_images:
            raise ValueError(
                f"{count} images exceed the limit of {self.max_images} per prompt"
                " (limit_mm_per_prompt)"
            )

    def item_key(self, prepared: PreparedImage, uuid: str | None, cache_salt: str | None) -> str:
        """The encoder-cache key: content hash, or the caller's uuid bound to the image's size
        and token count; either scoped by the tenant's ``cache_salt``."""
        mm_hash = prepared.mm_hash
        if uuid is not None:
            mc = self.model_config
            mm_hash = hash_uuid(uuid, mc.model, mc.processor_kwargs, prepared.length, prepared.size)
        return salted(mm_hash, cache_salt)

    def prepare_image(self, source: Any, cache_salt: str | None = None) -> PreparedImage:
        """Decode, hash and preprocess one image, or take all three from the memo when these
        exact bytes (or pixels) were seen before by the same tenant. Thread-safe."""
        if not self.preparer.accepts_images:
            raise ValueError("this model does not accept images")
        raw = self.preparer.read(source)
        if isinstance(raw, Image.Image):
            key = f"{cache_salt or ''}|px:{self.preparer.content_hash(checked_image(raw))}"
        else:
            key = memo_key(raw, cache_salt)
        prepared = self.memo.get(key)
        if prepared is None:
            prepared = self.preparer.prepare(raw)
            self.memo.put(key, prepared)
        return prepared


def memo_key(raw: bytes | str, cache_salt: str | None = None) -> str:
    """The memo key of encoded image bytes (or of a data URL, before decoding it), per tenant."""
    kind, data = ("url", raw.encode()) if isinstance(raw, str) else ("raw", raw)
    return f"{cache_salt or ''}|{kind}:{blake3.blake3(data).hexdigest()}"
