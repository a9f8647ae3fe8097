"""One image -> ``PreparedImage``: decode, content hash, the model's HF image processor.

``ImagePreparer`` has no cache and holds only picklable state, so admission threads and the
media worker processes (``media_workers``) run the very same code.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from mmserve.config import ModelConfig
from mmserve.multimodal.hashing import hash_image
from mmserve.multimodal.image_memo import PreparedImage
from mmserve.multimodal.media import checked_image, decode_image, read_image_source
from mmserve.multimodal.media_fetch import MediaFetcher, MediaFetchPolicy


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


class ImagePreparer:
    """Reads (under the media policy), decodes, hashes and preprocesses one image."""

    def __init__(
        self, model_config: ModelConfig, image_processor: Any, media_policy: MediaFetchPolicy
    ) -> None:
        self.model_config = model_config
        self.image_processor = image_processor
        self.media_policy = media_policy
        self.fetcher = MediaFetcher(media_policy)
        self.image_inputs = IMAGE_INPUTS.get(model_config.architecture)

    @property
    def accepts_images(self) -> bool:
        return self.image_inputs is not None

    def read(self, source: Any) -> Any:
        """The encoded bytes (or PIL image) behind ``source``."""
        return read_image_source(source, self.fetcher)

    def content_hash(self, image: Image.Image) -> str:
        return hash_image(image, self.model_config.model, self.model_config.processor_kwargs)

    def prepare(self, raw: Any) -> PreparedImage:
        """``raw``: encoded bytes, a PIL image, or any source ``read`` accepts."""
        if self.image_inputs is None:
            raise ValueError("this model does not accept images")
        if not isinstance(raw, (bytes, Image.Image)):
            raw = self.read(raw)
        image = checked_image(raw) if isinstance(raw, Image.Image) else decode_image(raw)
        data, length = self.image_inputs(self.image_processor, image, self.model_config)
        return PreparedImage(self.content_hash(image), data, length, image.size)
