"""Per-request ``mm_processor_kwargs``: which keys a family accepts, their checks, and one
``ImagePreparer`` per distinct merged setting.

A request's kwargs are merged over the engine's ``--mm-processor-kwargs``; the merged dict is
what the image's content hash (and so its encoder-cache key and the prefix-cache block hashes)
includes, so two requests with the same image and different kwargs never share embeddings or
KV blocks. The video sampling keys (``sampling_keys.VIDEO_KWARGS``: ``fps``, ``num_frames``,
``min_frames``, ``max_frames``) are merged the same way but stay out of everything about images
(``image_kwargs``): their preparer, memo keys and content or uuid hashes.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from mmserve.config import ModelConfig
from mmserve.multimodal.image.prep import ImagePreparer
from mmserve.multimodal.sampling_keys import VIDEO_KWARGS, without_sampling

FIELD = "mm_processor_kwargs"
_PIXELS = ("min_pixels", "max_pixels")
# architecture -> the image processor settings a request may change (vLLM's for these models)
REQUEST_KWARGS: dict[str, tuple[str, ...]] = {
    "LlavaForConditionalGeneration": (),
    "Qwen2VLForConditionalGeneration": _PIXELS + VIDEO_KWARGS,
    "Qwen2_5_VLForConditionalGeneration": _PIXELS + VIDEO_KWARGS,
    "Qwen3VLForConditionalGeneration": _PIXELS + VIDEO_KWARGS,
    "Gemma3ForConditionalGeneration": ("do_pan_and_scan",),
    "SmolVLMForConditionalGeneration": VIDEO_KWARGS,  # SmolVLM2's frame sampling
}
MAX_PREPARERS = 16  # distinct kwargs settings kept loaded (least recently used go first)


def canonical(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(dict(kwargs), sort_keys=True, default=str)


def check_request_kwargs(
    architecture: str, engine_kwargs: Mapping[str, Any], kwargs: Any
) -> dict[str, Any] | None:
    """The merged kwargs of a request, or None when it changes nothing; ValueError naming
    ``mm_processor_kwargs`` and the key for unknown keys or bad values."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"{FIELD} must be an object, got {type(kwargs).__name__}")
    accepted = REQUEST_KWARGS.get(architecture, ())
    for key, value in kwargs.items():
        if key not in accepted:
            names = ", ".join(accepted) or "none"
            raise ValueError(
                f"{FIELD}: unknown key {str(key)[:64]!r} for {architecture} (accepted: {names})"
            )
        if key in _PIXELS and (type(value) is not int or value < 1):
            raise ValueError(f"{FIELD}: {key} must be a positive integer, got {value!r}")
        if key == "do_pan_and_scan" and type(value) is not bool:
            raise ValueError(f"{FIELD}: {key} must be true or false, got {value!r}")
    if kwargs.get("fps") is not None and kwargs.get("num_frames") is not None:
        raise ValueError(f"{FIELD}: fps and num_frames exclude each other")
    rate = {"fps", "num_frames"}  # a request naming one replaces the engine's other
    base = {k: v for k, v in engine_kwargs.items() if not (rate & set(kwargs)) or k not in rate}
    merged = {**base, **kwargs}
    if all(key in merged for key in _PIXELS) and merged["min_pixels"] > merged["max_pixels"]:
        raise ValueError(
            f"{FIELD}: min_pixels ({merged['min_pixels']}) must be <= max_pixels"
            f" ({merged['max_pixels']})"
        )
    return None if merged == dict(engine_kwargs) else merged


def image_kwargs(
    engine_kwargs: Mapping[str, Any], merged: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """What the image processor reads of a request's merged kwargs (no video sampling keys),
    or None when that is the engine's setting."""
    if merged is None:
        return None
    image = without_sampling(merged)
    return None if image == without_sampling(engine_kwargs) else image


class PreparerCache:
    """``ImagePreparer``s for merged kwargs settings other than the engine's.

    Invariants: at most ``MAX_PREPARERS`` are held (LRU); each one's ``model_config`` carries
    its merged kwargs, so its content hashes differ from the engine preparer's; safe to use
    from several admission threads (a setting may be loaded twice by a race, never mixed up).
    """

    def __init__(self, base: ImagePreparer, load: Callable[[dict[str, Any]], Any]) -> None:
        self.base = base
        self.load = load  # merged kwargs -> image processor
        self._preparers: OrderedDict[str, ImagePreparer] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, merged: dict[str, Any] | None) -> ImagePreparer:
        merged = image_kwargs(self.base.model_config.processor_kwargs, merged)
        if merged is None:
            return self.base
        key = canonical(merged)
        with self._lock:
            preparer = self._preparers.get(key)
            if preparer is not None:
                self._preparers.move_to_end(key)
                return preparer
        base = self.base
        config: ModelConfig = dataclasses.replace(base.model_config, processor_kwargs=merged)
        try:
            image_processor = self.load(merged)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{FIELD}: the image processor rejected {merged}: {exc}") from None
        preparer = ImagePreparer(config, image_processor, base.media_policy, base.preprocessing)
        with self._lock:
            self._preparers[key] = preparer
            while len(self._preparers) > MAX_PREPARERS:
                self._preparers.popitem(last=False)
        return preparer
