"""The Idefics3 / SmolVLM vision tower: SigLIP (``siglip``) whose position ids come from
transformers' ``Idefics3VisionEmbeddings`` (NaViT-style fractional coordinates, bucketized).

Parameter names are SigLIP's (``embeddings.*``, ``encoder.layers.N.*``, ``post_layernorm``), as
the checkpoints' ``model.vision_model.*`` hold them; there is no pooling head. The output is
``last_hidden_state`` (every layer, then ``post_layernorm``).

Every image this tower takes is one full tile of ``image_size`` pixels a side (the Idefics3
image processor resizes and splits into exactly such tiles; its padding frames are dropped
before the tower in transformers too), so transformers' patch attention mask is all ones: the
attention is unmasked and the position ids are those of a full grid, computed with the very
float32 operations transformers uses (they are *not* always ``arange``: 19 or 40 patches a
side give another grid).
"""

from __future__ import annotations

from typing import Any

import torch

from mmserve.models.vision.siglip import SiglipVisionEmbeddings, SiglipVisionTower


def full_tile_position_ids(
    patches_per_side: int, device: torch.device | None = None
) -> torch.Tensor:
    """[patches_per_side**2] position ids of a tile whose patches are all real, as
    ``Idefics3VisionEmbeddings.forward`` computes them for an all-ones patch mask."""
    side = patches_per_side
    boundaries = torch.arange(1 / side, 1.0, 1 / side, device=device)
    step = 1.0 / torch.full((1,), side, device=device)  # nb_patches / mask sums: int64
    indices = torch.arange(side, device=device, dtype=torch.float32)
    coords = torch.clamp(indices[None, :] * step[:, None], max=(1.0 - 1e-6))
    buckets = torch.bucketize(coords, boundaries, right=True)[0]
    return (buckets[:, None] * side + buckets[None, :]).reshape(-1)


class Idefics3VisionEmbeddings(SiglipVisionEmbeddings):
    """SigLIP's patch convolution with Idefics3's position ids of a full tile."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, C, image_size, image_size] -> [B, patches, dim]."""
        _, _, height, width = pixel_values.shape
        if height != self.image_size or width != self.image_size:
            raise ValueError(
                f"tile of {height}x{width} pixels, the Idefics3 vision tower takes"
                f" {self.image_size}x{self.image_size} (the processor's max_image_size)"
            )
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        ids = full_tile_position_ids(self.image_size // self.patch_size, pixel_values.device)
        return patches + self.position_embedding(ids)


class Idefics3VisionTower(SiglipVisionTower):
    """``forward(tiles)`` = transformers' ``Idefics3VisionTransformer(tiles).last_hidden_state``
    for full tiles: [B, 3, image_size, image_size] -> [B, patches, vision_hidden]."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, feature_layer=-1, post_layernorm=True)
        self.embeddings = Idefics3VisionEmbeddings(config)
