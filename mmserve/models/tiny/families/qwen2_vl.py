"""Tiny random-weight Qwen2-VL presets: spec, HF config and processor files.

The checkpoint layout is that of ``Qwen/Qwen2-VL-*-Instruct`` minus the ``Qwen2VLProcessor`` (its
video processor needs torchvision): ``config.json``, ``generation_config.json``,
``model.safetensors``, the tokenizer files with ``chat_template.jinja`` and
``preprocessor_config.json`` (``Qwen2VLImageProcessor`` with ``min_pixels``/``max_pixels`` as
``size.shortest_edge``/``size.longest_edge``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from ..build_steps import save_processor_files
from ..config_parts import chatml_generation_ids, qwen2_text_config
from ..sizes import BENCH_TEXT, CI_TEXT, TextSizes
from ..tokenizer import QWEN2_VL, QWEN_SPECIAL_TOKEN_IDS, TokenizerFlavor

IDS = QWEN_SPECIAL_TOKEN_IDS


@dataclass(frozen=True)
class Qwen2VLPresetSpec(TextSizes):
    """Architecture and image-processor limits of one Qwen2-VL preset."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    vision_embed_dim: int
    vision_depth: int
    vision_heads: int
    vision_mlp_ratio: int
    mrope_section: tuple[int, int, int]
    min_pixels: int
    max_pixels: int

    flavor: ClassVar[TokenizerFlavor] = QWEN2_VL
    model_class: ClassVar[type] = Qwen2VLForConditionalGeneration
    config_class: ClassVar[type] = Qwen2VLConfig

    def __post_init__(self) -> None:
        half_head = self.text_hidden // self.text_heads // 2
        if sum(self.mrope_section) != half_head:
            raise ValueError(f"mrope_section {self.mrope_section} must sum to {half_head}")

    def vision_tower_layout(self) -> dict[str, Any]:
        """The vision config entries every Qwen-VL generation names alike."""
        return dict(
            depth=self.vision_depth,
            num_heads=self.vision_heads,
            in_channels=3,
            patch_size=self.patch_size,
            spatial_merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        )

    def vision_widths(self) -> dict[str, Any]:
        """The vision tower widths as Qwen2.5-VL and later name them."""
        return dict(
            hidden_size=self.vision_embed_dim,
            out_hidden_size=self.text_hidden,
            intermediate_size=self.vision_embed_dim * self.vision_mlp_ratio,
        )

    def vision_config(self) -> dict[str, Any]:
        return dict(
            **self.vision_tower_layout(),
            embed_dim=self.vision_embed_dim,
            hidden_size=self.text_hidden,
            hidden_act="quick_gelu",
            mlp_ratio=self.vision_mlp_ratio,
        )

    def text_config(self) -> dict[str, Any]:
        return qwen2_text_config(self, rope={"mrope_section": list(self.mrope_section)})

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
        """bos/eos/pad of ``generation_config.json`` (mmserve also honours a list of eos ids,
        as released checkpoints have)."""
        return chatml_generation_ids()

    def image_processor_settings(self) -> dict[str, Any]:
        return dict(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
        )

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """Tokenizer files + chat template, and ``preprocessor_config.json``."""
        image_processor = Qwen2VLImageProcessorPil(**self.image_processor_settings())
        save_processor_files(out, tokenizer, image_processor)

    @classmethod
    def resized_from(cls, base: Qwen2VLPresetSpec, **changes: Any) -> Self:
        """A spec of this class with ``base``'s sizes and limits but for ``changes``."""
        kept = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
        return cls(**{**kept, **changes})


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
        **asdict(CI_TEXT),
        mrope_section=(4, 6, 6),
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
        **asdict(BENCH_TEXT),
        mrope_section=(8, 12, 12),
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 1280,
    ),
}
