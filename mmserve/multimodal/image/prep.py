"""One image -> ``PreparedImage``: decode, content hash, the model's image preprocessing.

``ImagePreparer`` has no cache and holds only picklable state, so admission threads and the
media worker processes (``workers``) run the very same code. Preprocessing runs the fast
path of ``image.fast`` where it covers the processor's settings and the HF image
processor elsewhere; the mode comes from the ``preprocessing`` argument, else from
``$MMSERVE_IMAGE_PREPROCESSING``, else it is ``"exact"`` (pixel values bit-identical to the HF
processor's; ``"fast"`` is faster and not token-identical, ``"hf"`` runs the processor).

An image is prepared for a prompt's image count: a family with a multi-image mode
(``ImageInputs.multi_image``: LLaVA-OneVision) prepares each image of a prompt with several in
that mode (``ImagePreparer.multi_image``), as its processor does for the images of one sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PIL import Image

from mmserve.config import ModelConfig
from mmserve.multimodal.hashing import hash_image
from mmserve.multimodal.image.anyres import anyres_inputs, base_only_inputs, hf_anyres, hf_base_only
from mmserve.multimodal.image.decode import checked_image, decode_image, read_image_source
from mmserve.multimodal.image.fast import (
    DEFAULT_PREPROCESSING,
    PREPROCESSING_MODES,
    FastImageProcessing,
    fast_image_processor,
)
from mmserve.multimodal.image.fast_anyres import AnyresImageProcessing
from mmserve.multimodal.image.idefics3 import IDEFICS3_ARCHITECTURES, hf_tiles, tile_inputs
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.sampling_keys import without_sampling

PREPROCESSING_ENV = "MMSERVE_IMAGE_PREPROCESSING"


def _hf_llava(image_processor: Any, image: Image.Image) -> Any:
    return image_processor(images=image, return_tensors="np")["pixel_values"][0]


def _llava_inputs(pixel_values: Any, image_processor: Any, model_config: ModelConfig) -> Any:
    return pixel_values, model_config.max_tokens_per_image


def _hf_qwen2_vl(image_processor: Any, image: Image.Image) -> Any:
    out = image_processor(images=image, return_tensors="np")
    return out["pixel_values"], tuple(int(x) for x in out["image_grid_thw"][0])


def _qwen2_vl_inputs(processed: Any, image_processor: Any, model_config: ModelConfig) -> Any:
    """Dynamic resolution: flat patches + (t, h, w) patch grid; one embedding (and one
    ``<|image_pad|>``) per merge_size x merge_size block of patches."""
    patches, grid = processed
    length = grid[0] * grid[1] * grid[2] // image_processor.merge_size**2
    return {"pixel_values": patches, "image_grid_thw": grid}, length


def _hf_gemma3(image_processor: Any, image: Image.Image) -> Any:
    """[1 + crops, 3, H, W]: the image, then its pan-and-scan crops (none unless enabled).
    Settings the checkpoint leaves null take ``Gemma3Processor``'s defaults, as there."""
    from transformers import Gemma3Processor

    defaults = getattr(Gemma3Processor, "images_kwargs", {})
    kwargs = {k: v for k, v in defaults.items() if getattr(image_processor, k, None) is None}
    return image_processor(images=image, return_tensors="np", **kwargs)["pixel_values"]


def _gemma3_inputs(pixel_values: Any, image_processor: Any, model_config: ModelConfig) -> Any:
    """[3, H, W] without crops (as LLaVA's), else [1 + crops, 3, H, W]."""
    data = pixel_values[0] if len(pixel_values) == 1 else pixel_values
    return data, len(pixel_values) * model_config.max_tokens_per_image


def _gemma3_image_text(tokenizer: Any, model_config: ModelConfig) -> ImageText:
    """``Gemma3Processor``'s expansion of ``<start_of_image>``, pan-and-scan crops included."""
    tokens = tokenizer.image_token * model_config.hf_config.mm_tokens_per_image
    full = f"\n\n{tokenizer.boi_token}{tokens}{tokenizer.eoi_token}\n\n"

    def text(groups: int) -> str:
        if groups == 1:
            return full
        crops = " ".join([full] * (groups - 1))
        return (
            f"Here is the original image {full} and here are some crops to help you see"
            f" better {crops}"
        )

    return ImageText(tokenizer.boi_token, text)


@dataclass(frozen=True)
class ImageText:
    """A family whose processor expands the image marker in the prompt *text* (Gemma 3):
    ``text(groups)`` replaces ``marker`` for an image of ``groups`` embedding groups (the image
    and its crops: a 4-D data array has one row per group, any other data is one group), each
    written as one run of ``image_token_id`` placeholders."""

    marker: str
    text: Callable[[int], str]


FastCall = Callable[[Image.Image, bytes], Any]


def _fast_call(fast: FastImageProcessing) -> FastCall | None:
    return fast


def _fast_base_only(fast: FastImageProcessing) -> FastCall | None:
    return fast.base_only if isinstance(fast, AnyresImageProcessing) else None


@dataclass(frozen=True)
class ImageInputs:
    """One architecture's glue: ``hf`` runs the HF processor on one image; ``fast`` picks the
    call of the fast path (``image.fast``) that returns the same (None: the HF
    processor runs); ``inputs`` turns that into the model's image data and its embedding
    count. ``image_text`` (Gemma 3): see ``ImageText``. ``multi_image``: the glue for each
    image of a prompt with several, where the family has such a mode (LLaVA-OneVision: base
    resolution only); None: each is prepared as a lone image. ``tiled_text`` (SmolVLM): the
    processor writes each image's tiles into the prompt text, one item per image
    (``image.idefics3.TiledImageExpander``)."""

    hf: Callable[[Any, Image.Image], Any]
    inputs: Callable[[Any, Any, ModelConfig], tuple[Any, int]]
    image_text: Callable[[Any, ModelConfig], ImageText] | None = None
    multi_image: ImageInputs | None = None
    fast: Callable[[FastImageProcessing], FastCall | None] = _fast_call
    tiled_text: bool = False


ONEVISION_MULTI_IMAGE = ImageInputs(hf_base_only, base_only_inputs, fast=_fast_base_only)
IMAGE_INPUTS = {
    "LlavaForConditionalGeneration": ImageInputs(_hf_llava, _llava_inputs),
    "Qwen2VLForConditionalGeneration": ImageInputs(_hf_qwen2_vl, _qwen2_vl_inputs),
    # Qwen2.5-VL ships Qwen2-VL's image processor.
    "Qwen2_5_VLForConditionalGeneration": ImageInputs(_hf_qwen2_vl, _qwen2_vl_inputs),
    # so does Qwen3-VL (patch_size 16, mean / std 0.5)
    "Qwen3VLForConditionalGeneration": ImageInputs(_hf_qwen2_vl, _qwen2_vl_inputs),
    "LlavaOnevisionForConditionalGeneration": ImageInputs(
        hf_anyres, anyres_inputs, multi_image=ONEVISION_MULTI_IMAGE
    ),
    "LlavaNextForConditionalGeneration": ImageInputs(hf_anyres, anyres_inputs),
    "Gemma3ForConditionalGeneration": ImageInputs(_hf_gemma3, _gemma3_inputs, _gemma3_image_text),
    **{
        arch: ImageInputs(hf_tiles, tile_inputs, tiled_text=True) for arch in IDEFICS3_ARCHITECTURES
    },
}


def preprocessing_mode(mode: str | None = None) -> str:
    """``mode``, else ``$MMSERVE_IMAGE_PREPROCESSING``, else the default; checked."""
    source = "preprocessing"
    if mode is None:
        mode, source = os.environ.get(PREPROCESSING_ENV) or DEFAULT_PREPROCESSING, PREPROCESSING_ENV
    if mode not in PREPROCESSING_MODES:
        raise ValueError(f"{source} must be one of {', '.join(PREPROCESSING_MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class DecodedPixels:
    """A decoded image, its pixels (``image.tobytes()``) and their content hash
    (``ImagePreparer.content_hash``): what preparing needs of it, computed once."""

    image: Image.Image
    pixels: bytes
    mm_hash: str


class ImagePreparer:
    """Reads (under the media policy), decodes, hashes and preprocesses one image."""

    def __init__(
        self,
        model_config: ModelConfig,
        image_processor: Any,
        media_policy: MediaFetchPolicy,
        preprocessing: str | None = None,
    ) -> None:
        self.model_config = model_config
        self.image_processor = image_processor
        self.media_policy = media_policy
        self.fetcher = MediaFetcher(media_policy)
        self.image_inputs = IMAGE_INPUTS.get(model_config.architecture)
        self.preprocessing = preprocessing_mode(preprocessing)
        self.fast = (
            fast_image_processor(image_processor, self.preprocessing)
            if self.image_inputs is not None
            else None
        )

    @property
    def accepts_images(self) -> bool:
        return self.image_inputs is not None

    def multi_image(self, num_images: int) -> bool:
        """Whether the images of a prompt with ``num_images`` are prepared in the model's
        multi-image mode (a family that has one, more than one image)."""
        return (
            num_images > 1
            and self.image_inputs is not None
            and self.image_inputs.multi_image is not None
        )

    def read(self, source: Any) -> Any:
        """The encoded bytes (or PIL image) behind ``source``."""
        return read_image_source(source, self.fetcher)

    def content_hash(self, image: Image.Image, pixels: bytes | None = None) -> str:
        """``pixels``: ``image.tobytes()`` if the caller has it already. The video sampling
        keys of the processor kwargs are left out: they do not change images."""
        mc = self.model_config
        return hash_image(image, mc.model, without_sampling(mc.processor_kwargs), pixels)

    def decoded_pixels(self, image: Image.Image) -> DecodedPixels:
        """A decoded image (checked) with its pixels copied out once and their content hash."""
        image = checked_image(image)
        pixels = image.tobytes()
        return DecodedPixels(image, pixels, self.content_hash(image, pixels))

    def prepare(self, raw: Any, multi_image: bool = False) -> PreparedImage:
        """``raw``: encoded bytes, a PIL image, ``decoded_pixels`` of one, or any source
        ``read`` accepts; ``multi_image``: prepare it in the multi-image mode
        (``multi_image(count)``)."""
        glue = self.image_inputs
        if glue is None:
            raise ValueError("this model does not accept images")
        if multi_image:
            if glue.multi_image is None:
                raise ValueError(f"{self.model_config.architecture} has no multi-image mode")
            glue = glue.multi_image
        if not isinstance(raw, (bytes, Image.Image, DecodedPixels)):
            raw = self.read(raw)
        if not isinstance(raw, DecodedPixels):
            image = checked_image(raw) if isinstance(raw, Image.Image) else decode_image(raw)
            raw = self.decoded_pixels(image)
        image, pixels = raw.image, raw.pixels  # one copy for the hash and the fast path
        fast = glue.fast(self.fast) if self.fast is not None and self.fast.accepts(image) else None
        if fast is not None:
            processed = fast(image, pixels)
        else:
            processed = glue.hf(self.image_processor, image)
        data, length = glue.inputs(processed, self.image_processor, self.model_config)
        return PreparedImage(raw.mm_hash, data, length, image.size, multi_image)
