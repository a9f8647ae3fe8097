"""The ``Qwen2VLImageProcessor`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) redone with patches cut in
uint8 (see ``image.fast``, which builds ``Qwen2VLImageProcessing`` from a processor's
settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

if TYPE_CHECKING:
    from mmserve.multimodal.image.fast_pixels import PixelSteps


@dataclass(frozen=True)
class Qwen2VLImageProcessing:
    """``Qwen2VLImageProcessor``: ``smart_resize`` to multiples of patch x merge, rescale,
    normalize, then flat patches (t*h*w, C*T*p*p) with the frame repeated T times, and the
    (t, h, w) patch grid."""

    pixels: PixelSteps
    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int

    def accepts(self, image: Image.Image) -> bool:
        return self.pixels.accepts(image)

    def __call__(
        self, image: Image.Image, pixels: bytes | None = None
    ) -> tuple[np.ndarray, tuple[int, int, int]]:
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        height, width = smart_resize(
            image.height,
            image.width,
            factor=p * m,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        rgb = self.pixels.resize(image, pixels, height, width)
        gh, gw = height // p, width // p
        # (H, W, C) -> (gh/m, gw/m, m, m, C, p, p): the processor's patch order, still uint8
        patches = rgb.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
        patches = np.ascontiguousarray(patches).reshape(gh * gw, 3, 1, p * p)
        values = self.pixels.rescale_normalize(patches, (3, 1, 1))
        out = np.empty((gh * gw, 3, t, p * p), np.float32)
        out[...] = values  # the one frame repeated temporal_patch_size times
        return out.reshape(gh * gw, 3 * t * p * p), (1, gh, gw)
