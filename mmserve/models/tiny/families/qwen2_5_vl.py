"""Tiny random-weight Qwen2.5-VL presets.

The layout is that of ``Qwen/Qwen2.5-VL-*-Instruct`` as the Qwen2-VL presets write it (see
``qwen2_vl.py``): Qwen2.5-VL ships Qwen2-VL's image processor and chat format, so only the
config (``Qwen2_5_VLConfig``: SwiGLU/RMSNorm vision tower with window attention) differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from .qwen2_vl import QWEN2_VL_PRESETS, Qwen2VLPresetSpec


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
            **self.vision_tower_layout(),
            **self.vision_widths(),
            hidden_act="silu",
            window_size=self.window_size,
            fullatt_block_indexes=list(self.fullatt_block_indexes),
            tokens_per_second=2,
        )


QWEN2_5_VL_PRESETS: dict[str, Qwen2_5_VLPresetSpec] = {
    # ~0.9M params, for CI: tiny-qwen2-vl with 3 vision layers (window, full, window); 4 x 4
    # merged-patch windows, so most images have partial windows on their right and bottom edges.
    "tiny-qwen2.5-vl": Qwen2_5_VLPresetSpec.resized_from(
        QWEN2_VL_PRESETS["tiny-qwen2-vl"], vision_depth=3, fullatt_block_indexes=(1,)
    ),
    # ~16M params, for benchmarks: sized like tiny-qwen2-vl-small, the released processor
    # limits (<= 1280 embeddings); layers 1 and 3 attend over the whole image.
    "tiny-qwen2.5-vl-small": Qwen2_5_VLPresetSpec.resized_from(
        QWEN2_VL_PRESETS["tiny-qwen2-vl-small"], fullatt_block_indexes=(1, 3)
    ),
}
