"""Tiny random-weight Qwen3-VL presets.

The layout is that of ``Qwen/Qwen3-VL-*-Instruct`` as the Qwen2-VL presets write it (see
``qwen2_vl.py``): ``config.json`` (``Qwen3VLConfig``: DeepStack vision tower with learned
position embeddings, Qwen3 text model with interleaved M-RoPE), ``generation_config.json``,
``model.safetensors``, the tokenizer files with the ChatML ``chat_template.jinja`` (Qwen3-VL's
shape: no default system prompt) and ``preprocessor_config.json``: Qwen3-VL ships Qwen2-VL's
image processor with ``patch_size`` 16, mean and std 0.5 (its ``Qwen3VLProcessor`` and video
processor need torchvision and are left out, as for Qwen2-VL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from .qwen2_vl import QWEN2_VL_PRESETS, Qwen2VLPresetSpec

HALF_MEAN_STD = [0.5, 0.5, 0.5]


@dataclass(frozen=True)
class Qwen3VLPresetSpec(Qwen2VLPresetSpec):
    """A Qwen2-VL spec plus Qwen3-VL's learned position grid and DeepStack layers; the vision
    MLP is ``vision_embed_dim * vision_mlp_ratio`` wide, ``mrope_section`` is interleaved."""

    num_position_embeddings: int = 2304  # a 48 x 48 grid, as released
    deepstack_visual_indexes: tuple[int, ...] = (0, 1)

    model_class: ClassVar[type] = Qwen3VLForConditionalGeneration
    config_class: ClassVar[type] = Qwen3VLConfig

    def vision_config(self) -> dict[str, Any]:
        return dict(
            **self.vision_tower_layout(),
            **self.vision_widths(),
            hidden_act="gelu_pytorch_tanh",
            num_position_embeddings=self.num_position_embeddings,
            deepstack_visual_indexes=list(self.deepstack_visual_indexes),
        )

    def text_config(self) -> dict[str, Any]:
        config = super().text_config()
        del config["use_sliding_window"]
        config["head_dim"] = self.text_hidden // self.text_heads
        config["attention_bias"] = False
        config["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": list(self.mrope_section),
            "mrope_interleaved": True,
        }
        return config

    def image_processor_settings(self) -> dict[str, Any]:
        return dict(
            **super().image_processor_settings(),
            image_mean=HALF_MEAN_STD,
            image_std=HALF_MEAN_STD,
        )


QWEN3_VL_PRESETS: dict[str, Qwen3VLPresetSpec] = {
    # ~1M params, for CI: tiny-qwen2-vl with 3 vision and 3 decoder layers, DeepStack from
    # vision layers 0 and 1 into decoder layers 0 and 1; a 4 x 4 position grid, so every image
    # resamples it. 32x32 pixels per embedding; max_pixels 512*512 -> <= 256 embeddings.
    "tiny-qwen3-vl": Qwen3VLPresetSpec.resized_from(
        QWEN2_VL_PRESETS["tiny-qwen2-vl"],
        patch_size=16,
        vision_depth=3,
        text_layers=3,
        mrope_section=(6, 5, 5),
        min_pixels=64 * 64,
        max_pixels=512 * 512,
        num_position_embeddings=16,
        deepstack_visual_indexes=(0, 1),
    ),
    # ~19M params, for benchmarks: sized like tiny-qwen2-vl-small, three DeepStack layers
    # (as released), the released processor limits (65536 to 16777216 pixels: up to 16384
    # embeddings, more than its 8192 positions; the benchmarks cap max_pixels).
    "tiny-qwen3-vl-small": Qwen3VLPresetSpec.resized_from(
        QWEN2_VL_PRESETS["tiny-qwen2-vl-small"],
        patch_size=16,
        mrope_section=(12, 10, 10),
        min_pixels=65536,
        max_pixels=16777216,
        num_position_embeddings=2304,
        deepstack_visual_indexes=(0, 1, 2),
    ),
}
