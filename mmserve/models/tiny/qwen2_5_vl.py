"""Tiny random-weight Qwen2.5-VL presets.

The layout is that of ``Qwen/Qwen2.5-VL-*-Instruct`` as the Qwen2-VL presets write it (see
``qwen2_vl.py``): Qwen2.5-VL ships Qwen2-VL's image processor and chat format, so only the
config (``Qwen2_5_VLConfig``: SwiGLU/RMSNorm vision tower with window attention) differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from .qwen2_vl import Qwen2VLPresetSpec


@dataclass(frozen=True)
class Qwen2_5_VLPresetSpec(Qwen2VLPresetSpec):
    """A Qwen2-VL spec plus the window attention of the vision tower; its MLP is
    ``vision_embed_dim * vision_mlp_ratio`` wide."""

    window_size: int = 112  # pixels, as released: 4 x 4 merged patches of 28 x 28
    fullatt_block_indexes: tuple[int, ...] = (1,)

    model_class: ClassVar[type] = Qwen2_5_VLForConditionalGeneration
    config_class: ClassVar[type] = Qwen2_5_VLConfig

    def vision_config(self) -> dict[str, Any]:
        return dict(
            depth=self.vision_depth,
            hidden_size=self.vision_embed_dim,
            out_hidden_size=self.text_hidden,
            intermediate_size=self.vision_embed_dim * self.vision_mlp_ratio,
            hidden_act="silu",
            num_heads=self.vision_heads,
            in_channels=3,
            patch_size=self.patch_size,
            spatial_merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
            window_size=self.window_size,
            fullatt_block_indexes=list(self.fullatt_block_indexes),
            tokens_per_second=2,
        )


QWEN2_5_VL_PRESETS: dict[str, Qwen2_5_VLPresetSpec] = {
    # ~0.9M params, for CI: 3 vision layers (window, full, window); 4 x 4 merged-patch windows,
    # so most images have partial windows on their right and bottom edges.
    "tiny-qwen2.5-vl": Qwen2_5_VLPresetSpec(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        vision_embed_dim=32,
        vision_depth=3,
        vision_heads=2,
        vision_mlp_ratio=2,
        text_hidden=128,
        text_intermediate=256,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        mrope_section=(4, 6, 6),
        vocab_size=2048,
        max_position_embeddings=4096,
        min_pixels=56 * 56,
        max_pixels=448 * 448,
        fullatt_block_indexes=(1,),
    ),
    # ~16M params, for benchmarks: sized like tiny-qwen2-vl-small, the released processor
    # limits (<= 1280 embeddings); layers 1 and 3 attend over the whole image.
    "tiny-qwen2.5-vl-small": Qwen2_5_VLPresetSpec(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        vision_embed_dim=192,
        vision_depth=4,
        vision_heads=4,
        vision_mlp_ratio=4,
        text_hidden=512,
        text_intermediate=896,
        text_layers=4,
        text_heads=8,
        text_kv_heads=4,
        mrope_section=(8, 12, 12),
        vocab_size=4096,
        max_position_embeddings=8192,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
        fullatt_block_indexes=(1, 3),
    ),
}
