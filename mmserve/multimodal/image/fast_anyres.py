"""The LLaVA-NeXT / LLaVA-OneVision image processors' anyres tiling redone in uint8 (see
``image.fast``, which builds ``AnyresImageProcessing`` from a processor's settings).

The processor resizes the image to fit the best pinpoint resolution (aspect kept), pads it
with zeros (centered) to that resolution and cuts it into crops, row by row; the base crop is
the whole image resized to one crop. Every later per-crop step (a resize to the crop's own
size, a center crop to it) is the identity, so here the resized images are cut as uint8 and
all crops rescaled and normalized in one pass: pixel values bit-identical in ``"exact"`` mode.

``base_only`` is OneVision's multi-image mode (see ``multimodal.anyres``): the image padded to a
square with the processor's ``image_mean`` color (``pad_to_square``), then resized to one crop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
from transformers.image_utils import ChannelDimension

if TYPE_CHECKING:
    from mmserve.multimodal.image.fast_pixels import PixelSteps


@dataclass(frozen=True)
class AnyresImageProcessing:
    """Anyres tiling -> ((1 + rows * cols, 3, crop, crop) float32, (height, width)): what
    ``multimodal.anyres.hf_anyres`` returns from the HF processor. ``pad_color``: the
    multi-image mode's square padding, ``int(mean * 255)`` per channel as the processor's
    (None without an ``image_mean``)."""

    pixels: PixelSteps
    crop: int
    grid_pinpoints: tuple[tuple[int, int], ...]
    pad_color: tuple[int, int, int] | None = None

    def accepts(self, image: Image.Image) -> bool:
        return self.pixels.accepts(image)

    def __call__(
        self, image: Image.Image, pixels: bytes | None = None
    ) -> tuple[np.ndarray, tuple[int, int]]:
        height, width, crop = image.height, image.width, self.crop
        best_h, best_w = select_best_resolution((height, width), list(self.grid_pinpoints))
        new_h, new_w = get_patch_output_size(
            np.broadcast_to(np.uint8(0), (3, height, width)),  # a shape only
            (best_h, best_w),
            input_data_format=ChannelDimension.FIRST,
        )
        rows, cols = best_h // crop, best_w // crop
        tiles = np.zeros((1 + rows * cols, crop, crop, 3), np.uint8)
        tiles[0] = self.pixels.resize(image, pixels, crop, crop)
        canvas = np.zeros((best_h, best_w, 3), np.uint8)
        top, left = (best_h - new_h) // 2, (best_w - new_w) // 2
        canvas[top : top + new_h, left : left + new_w] = self.pixels.resize(
            image, pixels, new_h, new_w
        )
        grid = canvas.reshape(rows, crop, cols, crop, 3).transpose(0, 2, 1, 3, 4)
        tiles[1:] = grid.reshape(rows * cols, crop, crop, 3)
        values = self.pixels.rescale_normalize(tiles.transpose(0, 3, 1, 2), (1, 3, 1, 1))
        return values, (height, width)

    def base_only(
        self, image: Image.Image, pixels: bytes | None = None
    ) -> tuple[np.ndarray, tuple[int, int]]:
        """The multi-image mode -> ((1, 3, crop, crop) float32, (height, width)): what
        ``multimodal.anyres.hf_base_only`` returns from the HF processor."""
        if self.pad_color is None:
            raise ValueError("the image processor has no image_mean to pad images to squares")
        rgb = self.pixels.rgb(image, pixels)
        height, width = rgb.shape[:2]
        if height != width:  # centered on a square of the longer side (``pad_to_square``)
            side = max(height, width)
            square = np.empty((side, side, 3), np.uint8)
            square[:] = self.pad_color
            top, left = (side - height) // 2, (side - width) // 2
            square[top : top + height, left : left + width] = rgb
            rgb = square
        tile = self.pixels.resize_array(rgb, self.crop, self.crop)
        values = self.pixels.rescale_normalize(tile.transpose(2, 0, 1)[None], (1, 3, 1, 1))
        return values, (height, width)
