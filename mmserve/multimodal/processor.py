"""Prompt + images -> token ids with expanded placeholders and per-image (hash, offset, length)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
from PIL import Image

from mmserve.config import ModelConfig
from mmserve.core.outputs import MultiModalItem
from mmserve.multimodal.hashing import hash_image, hash_uuid, salted
from mmserve.multimodal.image_memo import PreparedImage, ProcessedImageMemo
from mmserve.multimodal.media import checked_image, decode_image, read_image_source
from mmserve.multimodal.media_fetch import MediaFetcher, MediaFetchPolicy


@dataclass
class ProcessedPrompt:
    prompt_token_ids: list[int]
    mm_items: list[MultiModalItem]


def _llava_image_inputs(
    image_processor: Any, image: Image.Image, model_config: ModelConfig
) -> tuple[Any, int]:
    pixel_values = image_processor(images=image, return_tensors="np")["pixel_values"][0]
    return pixel_values, model_config.max_tokens_per_image


def _qwen2_vl_image_inputs(
    image_processor: Any, image: Image.Image, model_config: ModelConfig
) -> tuple[dict[str, Any], int]:
    """Dynamic resolution: flat patches + (t, h, w) patch grid; one embedding (and one
    ``<|image_pad|>``) per merge_size x merge_size block of patches."""
    out = image_processor(images=image, return_tensors="np")
    grid = tuple(int(x) for x in out["image_grid_thw"][0])
    length = grid[0] * grid[1] * grid[2] // image_processor.merge_size**2
    return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}, length


IMAGE_INPUTS = {
    "LlavaForConditionalGeneration": _llava_image_inputs,
    "Qwen2VLForConditionalGeneration": _qwen2_vl_image_inputs,
}


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
        self.image_processor = image_processor
        self.max_images = max_images
        self.media_policy = media_policy
        self.fetcher = MediaFetcher(media_policy)
        self._image_inputs = IMAGE_INPUTS.get(model_config.architecture)
        self.memo = ProcessedImageMemo()

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
        places = np.flatnonzero(ids == image_token) if image_token is not None else np.empty(0)
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
            prepared = source if isinstance(source, PreparedImage) else self.prepare_image(source)
            key = self.item_key(prepared, uuids[i] if uuids is not None else None, cache_salt)
            repeats[place] = prepared.length
            items.append(MultiModalItem(key, int(place) + shift, prepared.length, prepared.data))
            shift += prepared.length - 1
        return ProcessedPrompt(np.repeat(ids, repeats).tolist(), items)

    def check_num_images(self, count: int) -> None:
        if count and self._image_inputs is None:
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

    def prepare_image(self, source: Any) -> PreparedImage:
        """Decode, hash and preprocess one image, or take all three from the memo when these
        exact bytes (or pixels) were seen before. Thread-safe."""
        if self._image_inputs is None:
            raise ValueError("this model does not accept images")
        raw = read_image_source(source, self.fetcher)
        image = checked_image(raw) if isinstance(raw, Image.Image) else None
        mm_hash = self._content_hash(image) if image is not None else None
        key = f"px:{mm_hash}" if image is not None else f"raw:{blake3.blake3(raw).hexdigest()}"
        prepared = self.memo.get(key)
        if prepared is None:
            if image is None:
                image = decode_image(raw)
                mm_hash = self._content_hash(image)
            data, length = self._image_inputs(self.image_processor, image, self.model_config)
            prepared = PreparedImage(mm_hash, data, length, image.size)
            self.memo.put(key, prepared)
        return prepared

    def _content_hash(self, image: Image.Image) -> str:
        return hash_image(image, self.model_config.model, self.model_config.processor_kwargs)
