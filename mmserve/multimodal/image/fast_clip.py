"""The ``CLIPImageProcessor`` (LLaVA) redone in uint8 until the last step (see
``image.fast``, which builds ``ClipImageProcessing`` from a processor's settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from transformers.image_transforms import center_crop, get_resize_output_image_size
from transformers.image_utils import ChannelDimension

if TYPE_CHECKING:
    from mmserve.multimodal.image.fast_pixels import PixelSteps


@dataclass(frozen=True)
class ClipImageProcessing:
    """``CLIPImageProcessor``: shortest-edge (or fixed) resize, center crop, rescale, normalize
    -> (3, H, W) float32."""

    pixels: PixelSteps
    shortest_edge: int | None  # resize so the short side is this (aspect kept) ...
    size: tuple[int, int] | None  # ... or to this (height, width); both None: no resize
    crop: tuple[int, int] | None  # center crop (height, width), zero-padded when larger

    def accepts(self, image: Image.Image) -> bool:
        return self.pixels.accepts(image)

    def __call__(self, image: Image.Image, pixels: bytes | None = None) -> np.ndarray:
        if self.shortest_edge is not None:
            height, width = get_resize_output_image_size(
                np.broadcast_to(np.uint8(0), (3, image.height, image.width)),  # a shape only
                size=self.shortest_edge,
                default_to_square=False,
                input_data_format=ChannelDimension.FIRST,
            )
            rgb = self.pixels.resize(image, pixels, height, width)
        elif self.size is not None:
            rgb = self.pixels.resize(image, pixels, *self.size)
        else:
            rgb = self.pixels.rgb(image, pixels)
        if self.crop is not None:
            rgb = center_crop(
                rgb,
                self.crop,
                data_format=ChannelDimension.LAST,
                input_data_format=ChannelDimension.LAST,
            )
        return self.pixels.rescale_normalize(rgb.transpose(2, 0, 1), (3, 1, 1))
