"""Tiny random-weight Qwen2-VL presets: spec, HF config and processor files.

The checkpoint layout is that of ``Qwen/Qwen2-VL-*-Instruct`` minus the ``Qwen2VLProcessor`` (its
video processor needs torchvision): ``config.json``, ``generation_config.json``,
``model.safetensors``, the tokenizer files with ``chat_template.jinja`` and
``preprocessor_config.json`` (``Qwen2VLImageProcessor`` with ``min_pixels``/``max_pixels`` as
``size.shortest_edge``/``size.longest_edge``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from .tokenizer import QWEN2_VL, QWEN_SPECIAL_TOKEN_IDS, TokenizerFlavor

IDS = QWEN_SPECIAL_TOKEN_IDS


@dataclass(frozen=True)
class Qwen2VLPresetSpec:
    """Architecture and image-processor limits of one Qwen2-VL preset."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    vision_embed_dim: int
    vision_depth: int
    vision_heads: int
    vision_mlp_ratio: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    mrope_section: tuple[int, int, int]
    vocab_size: int
    max_position_embeddings: int
    min_pixels: int
    max_pixels: int

    flavor: ClassVar[TokenizerFlavor] = QWEN2_VL
    model_class: ClassVar[type] = Qwen2VLForConditionalGeneration
    config_class: ClassVar[type] = Qwen2VLConfig

    def __post_init__(self) -> None:
        half_head = self.text_hidden // self.text_heads // 2
        if sum(self.mrope_section) != half_head:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to {half_head}")

    def vision_config(self) -> dict[str, Any]:
        return dict(
            depth=self.vision_depth,
            embed_dim=self.vision_embed_dim,
            hidden_size=self.text_hidden,
            hidden_act="quick_gelu",
            mlp_ratio=self.vision_mlp_ratio,
            num_heads=self.vision_heads,
            in_channels=3,
            patch_size=self.patch_size,
            spatial_merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        )

    def text_config(self) -> dict[str, Any]:
        return dict(
            vocab_size=self.vocab_size,
            hidden_size=self.text_hidden,
            intermediate_size=self.text_intermediate,
            num_hidden_layers=self.text_layers,
            num_attention_heads=self.text_heads,
            num_key_value_heads=self.text_kv_heads,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": list(self.mrope_section),
            },
            bos_token_id=None,
            eos_token_id=IDS["<|im_end|>"],
            pad_token_id=IDS["<|endoftext|>"],
        )

    def make_config(self) -> Any:
        """The HF config (``config_class``) with its vision and text sub-configs."""
        config = self.config_class(
            vision_config=self.vision_config(),
            text_config=self.text_config(),
            image_token_id=IDS["<|image_pad|>"],
            video_token_id=IDS["<|video_pad|>"],
            vision_start_token_id=IDS["<|vision_start|>"],
            vision_end_token_id=IDS["<|vision_end|>"],
            tie_word_embeddings=False,
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        """bos/eos/pad of ``generation_config.json`` (eos = ``<|im_end|>``, the chat turn end;
        mmserve also honours a list of eos ids, as released checkpoints have)."""
        return {
            "bos_token_id": None,
            "eos_token_id": IDS["<|im_end|>"],
            "pad_token_id": IDS["<|endoftext|>"],
        }

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """Tokenizer files + chat template, and ``preprocessor_config.json``."""
        tokenizer.save_pretrained(out)
        Qwen2VLImageProcessorPil(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        ).save_pretrained(out)


QWEN2_VL_PRESETS: dict[str, Qwen2VLPresetSpec] = {
    # ~1M params, for CI. 28x28 pixels per embedding; max_pixels 448*448 -> <= 256 embeddings.
    "tiny-qwen2-vl": Qwen2VLPresetSpec(
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        vision_embed_dim=32,
        vision_depth=2,
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
    ),
    # ~16M params, for benchmarks; the released Qwen2-VL processor limits (<= 1280 embeddings).
    "tiny-qwen2-vl-small": Qwen2VLPresetSpec(
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
    ),
}
