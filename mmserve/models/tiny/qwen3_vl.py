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
from pathlib import Path
from typing import Any, ClassVar

from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from .qwen2_vl import Qwen2VLPresetSpec

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
            depth=self.vision_depth,
            hidden_size=self.vision_embed_dim,
            out_hidden_size=self.text_hidden,
            intermediate_size=self.vision_embed_dim * self.vision_mlp_ratio,
            hidden_act="gelu_pytorch_tanh",
            num_heads=self.vision_heads,
            in_channels=3,
            patch_size=self.patch_size,
            spatial_merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
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

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        tokenizer.save_pretrained(out)
        Qwen2VLImageProcessorPil(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
            image_mean=HALF_MEAN_STD,
            image_std=HALF_MEAN_STD,
        ).save_pretrained(out)


QWEN3_VL_PRESETS: dict[str, Qwen3VLPresetSpec] = {
    # ~1M params, for CI: DeepStack from vision layers 0 and 1 into decoder layers 0 and 1 of
    # 3; a 4 x 4 position grid, so every image resamples it. 32x32 pixels per embedding;
    # max_pixels 512*512 -> <= 256 embeddings.
    "tiny-qwen3-vl": Qwen3VLPresetSpec(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        vision_embed_dim=32,
        vision_depth=3,
        vision_heads=2,
        vision_mlp_ratio=2,
        text_hidden=128,
        text_intermediate=256,
        text_layers=3,
        text_heads=4,
        text_kv_heads=2,
        mrope_section=(6, 5, 5),
        vocab_size=2048,
        max_position_embeddings=4096,
        min_pixels=64 * 64,
        max_pixels=512 * 512,
        num_position_embeddings=16,
        deepstack_visual_indexes=(0, 1),
    ),
    # ~19M params, for benchmarks: sized like tiny-qwen2.5-vl-small, three DeepStack layers
    # (as released), the released processor limits (65536 to 16777216 pixels: up to 16384
    # embeddings, more than its 8192 positions; the benchmarks cap max_pixels).
    "tiny-qwen3-vl-small": Qwen3VLPresetSpec(
        patch_size=16,
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
        mrope_section=(12, 10, 10),
        vocab_size=4096,
        max_position_embeddings=8192,
        min_pixels=65536,
        max_pixels=16777216,
        num_position_embeddings=2304,
        deepstack_visual_indexes=(0, 1, 2),
    ),
}
