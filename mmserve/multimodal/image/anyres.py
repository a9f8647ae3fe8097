"""LLaVA-NeXT / LLaVA-OneVision "anyres" geometry: an image's crop grid and embedding count.

The image processor resizes an image into the best-fitting grid of ``image_grid_pinpoints``
(padding the rest), cuts it into crops of the vision tower's size and prepends the whole image
resized to one crop (the base). The model keeps the base's embeddings, lays the crops' features
out as one feature map, removes the padding (unpads to the original aspect ratio), for
OneVision bilinearly shrinks it when it exceeds ``anyres_max_N`` crops' worth, and appends
``image_newline`` after every row. Admission (the placeholder count) and the model (packing)
both read this module, so the two always agree; the formulas are transformers'
``LlavaOnevisionProcessor._get_number_of_features`` and ``pack_image_features``.

OneVision's multi-image mode: the images of a prompt with several (one sample to transformers'
processor: a chat's images, in one message or across turns) are not tiled. Each is padded to a
square with the mean color and resized to one crop (``need_patching = n == 1`` in the image
processor); the model keeps that crop's embeddings and appends one ``image_newline``
(``base_only_inputs``). LLaVA-NeXT has no such mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from PIL import Image
from transformers.image_processing_utils import select_best_resolution

from mmserve.config import ModelConfig

POOL_THRESHOLD = 1.1  # OneVision shrinks the feature map only when it exceeds the cap by 10%


@dataclass(frozen=True)
class AnyresGeometry:
    """The settings that fix an image's crop grid and embedding count.

    ``patches``: patches per crop side; ``max_crops``: OneVision's ``anyres_max_N`` (None for
    LLaVA-NeXT, which never shrinks); sizes are (height, width) throughout.
    """

    crop_size: int
    patches: int
    grid_pinpoints: tuple[tuple[int, int], ...]
    max_crops: int | None

    @classmethod
    def from_config(cls, hf_config: Any) -> AnyresGeometry:
        vision = hf_config.vision_config
        aspect = getattr(hf_config, "vision_aspect_ratio", None)
        max_crops = None
        if aspect is not None:
            if not aspect.startswith("anyres_max_"):
                raise ValueError(f"vision_aspect_ratio {aspect!r} is not 'anyres_max_<N>'")
            max_crops = int(aspect.removeprefix("anyres_max_"))
        return cls(
            crop_size=vision.image_size,
            patches=vision.image_size // vision.patch_size,
            grid_pinpoints=tuple((int(h), int(w)) for h, w in hf_config.image_grid_pinpoints),
            max_crops=max_crops,
        )

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of crops for an image of ``height`` x ``width`` pixels."""
        best_h, best_w = select_best_resolution((height, width), list(self.grid_pinpoints))
        return best_h // self.crop_size, best_w // self.crop_size

    def unpadded(self, height: int, width: int) -> tuple[int, int]:
        """The crops' feature map (rows, columns) once the padding is removed."""
        rows, cols = self.grid(height, width)
        cur_h, cur_w = rows * self.patches, cols * self.patches
        if width / height > cur_w / cur_h:
            new_h = int(round(height * (cur_w / width), 7))
            cur_h -= (cur_h - new_h) // 2 * 2
        else:
            new_w = int(round(width * (cur_h / height), 7))
            cur_w -= (cur_w - new_w) // 2 * 2
        return cur_h, cur_w

    def pooled(self, feat_h: int, feat_w: int) -> tuple[int, int]:
        """The feature map after OneVision's cap (unchanged when under it)."""
        if self.max_crops is None:
            return feat_h, feat_w
        ratio = math.sqrt(feat_h * feat_w / (self.max_crops * self.patches**2))
        if ratio <= POOL_THRESHOLD:
            return feat_h, feat_w
        return int(feat_h // ratio), int(feat_w // ratio)

    def tokens_for_map(self, feat_h: int, feat_w: int) -> int:
        """Base crop + the (pooled) map + one newline per row."""
        rows, cols = self.pooled(feat_h, feat_w)
        return self.patches**2 + rows * (cols + 1)

    def base_only_tokens(self) -> int:
        """Embeddings of an image in the multi-image mode: the base crop + one newline."""
        return self.patches**2 + 1

    def num_tokens(self, height: int, width: int) -> int:
        """Embeddings (and ``<image>`` placeholders) of an image of ``height`` x ``width``."""
        return self.tokens_for_map(*self.unpadded(height, width))

    def max_tokens(self) -> int:
        """An upper bound on ``num_tokens`` over every image size (so on ``base_only_tokens``,
        which every grid's count exceeds): each pinpoint grid with every amount of unpadding
        either side may remove (unpadding removes an even count of rows or of columns, never
        both). Exact for LLaVA-NeXT's pinpoints and the tiny presets;
        for the released OneVision config 8829, where sampled sizes reach 8765."""
        best = 0
        for height, width in self.grid_pinpoints:
            cur_h = height // self.crop_size * self.patches
            cur_w = width // self.crop_size * self.patches
            for removed in range(0, max(cur_h, cur_w), 2):
                if removed < cur_h:
                    best = max(best, self.tokens_for_map(cur_h - removed, cur_w))
                if removed < cur_w:
                    best = max(best, self.tokens_for_map(cur_h, cur_w - removed))
        return best


def hf_anyres(image_processor: Any, image: Image.Image) -> tuple[Any, tuple[int, int]]:
    """The HF processor's crops of one image [1 + rows * cols, C, H, W] and its (h, w)."""
    out = image_processor(images=image, return_tensors="np")
    height, width = (int(x) for x in out["image_sizes"][0])
    return out["pixel_values"][0], (height, width)


def anyres_inputs(
    processed: tuple[Any, tuple[int, int]], image_processor: Any, model_config: ModelConfig
) -> tuple[dict[str, Any], int]:
    """The model's image data and embedding count; a ValueError when the processor's crops do
    not form the grid the model config implies (the embeddings would not fit the
    placeholders)."""
    crops, (height, width) = processed
    geometry = AnyresGeometry.from_config(model_config.hf_config)
    rows, cols = geometry.grid(height, width)
    if len(crops) != 1 + rows * cols:
        raise ValueError(
            f"the image processor cut a {height}x{width} image into {len(crops)} crops, the"
            f" model config's image_grid_pinpoints give 1 + {rows}x{cols}: the processor's"
            " and the model's image_grid_pinpoints differ"
        )
    return {"pixel_values": crops, "image_size": (height, width)}, geometry.num_tokens(
        height, width
    )


def hf_base_only(image_processor: Any, image: Image.Image) -> tuple[Any, tuple[int, int]]:
    """The HF processor's one crop [1, C, H, W] of an image in the multi-image mode, and its
    (h, w). The processor picks the mode by the sample's image count, so it is given the image
    twice as one sample (the ``"hf"`` preprocessing mode only; the fast path is
    ``AnyresImageProcessing.base_only``)."""
    out = image_processor(images=[[image, image]], return_tensors="np")
    height, width = (int(x) for x in out["image_sizes"][0])
    return out["pixel_values"][0], (height, width)


def base_only_inputs(
    processed: tuple[Any, tuple[int, int]], image_processor: Any, model_config: ModelConfig
) -> tuple[dict[str, Any], int]:
    """The model's data for an image in the multi-image mode (``base_only``: its one crop
    packs to the crop's embeddings + ``image_newline``) and its embedding count."""
    crops, (height, width) = processed
    if len(crops) != 1:
        raise ValueError(f"{len(crops)} crops for an image of a multi-image prompt, expected 1")
    geometry = AnyresGeometry.from_config(model_config.hf_config)
    data = {"pixel_values": crops, "image_size": (height, width), "base_only": True}
    return data, geometry.base_only_tokens()
