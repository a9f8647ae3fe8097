"""Tiny random-weight LLaVA-1.5 presets: CLIP vision tower + LLaMA text model.

The layout is that of ``llava-hf/llava-1.5-*-hf``: ``config.json`` (``LlavaConfig``),
``generation_config.json``, ``model.safetensors``, the tokenizer files with
``chat_template.jinja``, ``preprocessor_config.json`` (``CLIPImageProcessorPil``) and
``processor_config.json`` (``LlavaProcessor``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from ..build_steps import save_processor_files
from ..config_parts import decoder_sizes
from ..sizes import BENCH_TEXT, BENCH_VIT, CI_TEXT, CI_VIT, TextSizes, VitSizes
from ..tokenizer import BOS, EOS, IMAGE, LLAVA, PAD, SPECIAL_TOKEN_IDS, TokenizerFlavor


@dataclass(frozen=True)
class PresetSpec(VitSizes, TextSizes):
    """Architecture of one preset (CLIP vision tower + LLaMA text model)."""

    image_size: int
    patch_size: int

    flavor: ClassVar[TokenizerFlavor] = LLAVA
    model_class: ClassVar[type] = LlavaForConditionalGeneration

    @property
    def num_image_tokens(self) -> int:
        """Image embeddings per image (CLS dropped by ``vision_feature_select_strategy``)."""
        return (self.image_size // self.patch_size) ** 2

    def make_config(self) -> LlavaConfig:
        """The ``LlavaConfig`` with its CLIP vision and LLaMA text sub-configs."""
        vision = CLIPVisionConfig(
            hidden_size=self.vision_hidden,
            intermediate_size=self.vision_intermediate,
            num_hidden_layers=self.vision_layers,
            num_attention_heads=self.vision_heads,
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=3,
            projection_dim=self.vision_hidden,
            hidden_act="quick_gelu",
            layer_norm_eps=1e-5,
        )
        text = LlamaConfig(
            **decoder_sizes(self),
            head_dim=self.text_hidden // self.text_heads,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            **self.generation_ids(),
        )
        config = LlavaConfig(
            vision_config=vision, text_config=text, **llava_projector_settings(self)
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        return {
            "bos_token_id": SPECIAL_TOKEN_IDS[BOS],
            "eos_token_id": SPECIAL_TOKEN_IDS[EOS],
            "pad_token_id": SPECIAL_TOKEN_IDS[PAD],
        }

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """``LlavaProcessor`` files, tokenizer files and ``preprocessor_config.json``."""
        image_processor = CLIPImageProcessorPil(
            size={"shortest_edge": self.image_size},
            crop_size={"height": self.image_size, "width": self.image_size},
        )
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            **llava_processor_settings(self.patch_size, tokenizer),
        )
        save_processor_files(out, tokenizer, image_processor, processor)


def llava_projector_settings(spec: PresetSpec) -> dict[str, Any]:
    """The projector and image-token settings LLaVA-1.5 and LLaVA-NeXT configs share."""
    return dict(
        image_token_index=SPECIAL_TOKEN_IDS[IMAGE],
        image_seq_length=spec.num_image_tokens,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
    )


def llava_processor_settings(patch_size: int, tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """The settings LLaVA-1.5 and LLaVA-NeXT processors share."""
    return dict(
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        chat_template=tokenizer.chat_template,
        image_token=IMAGE,
        # the processor counts (patches + additional) - 1 for the "default" strategy, so CLIP's
        # CLS token must be declared here to get exactly num_image_tokens placeholders
        num_additional_image_tokens=1,
    )


LLAVA_PRESETS: dict[str, PresetSpec] = {
    # ~0.87M params, for CI. 64x64 images, 4x4 patches -> 256 image tokens.
    "tiny-llava": PresetSpec(image_size=64, patch_size=4, **asdict(CI_VIT), **asdict(CI_TEXT)),
    # ~15M params, for benchmarks. 224x224 images, 14x14 patches -> 256 image tokens.
    "tiny-llava-small": PresetSpec(
        image_size=224, patch_size=14, **asdict(BENCH_VIT), **asdict(BENCH_TEXT)
    ),
}
