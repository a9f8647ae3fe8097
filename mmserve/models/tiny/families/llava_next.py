"""Tiny random-weight LLaVA-NeXT presets: a LLaVA-1.5 preset's CLIP + LLaMA with anyres tiling.

The layout is that of ``llava-hf/llava-v1.6-*-hf``: ``config.json`` (``LlavaNextConfig``),
``generation_config.json``, ``model.safetensors``, the LLaVA tokenizer files with
``chat_template.jinja``, ``preprocessor_config.json`` (``LlavaNextImageProcessor``) and
``processor_config.json`` (``LlavaNextProcessor``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    PreTrainedTokenizerFast,
)

from ..build_steps import save_processor_files
from ..config_parts import crop_pinpoints, pinpoint_lists
from ..tokenizer import LLAVA, TokenizerFlavor
from .llava import (
    LLAVA_PRESETS,
    PresetSpec,
    llava_processor_settings,
    llava_projector_settings,
)


@dataclass(frozen=True)
class LlavaNextPresetSpec:
    """The LLaVA-1.5 preset ``llava``'s sizes with crops of ``image_size`` pixels, ``patch_size``
    patches and the (height, width) ``grid_pinpoints``."""

    llava: str
    image_size: int
    patch_size: int
    grid_pinpoints: tuple[tuple[int, int], ...]

    flavor: ClassVar[TokenizerFlavor] = LLAVA
    model_class: ClassVar[type] = LlavaNextForConditionalGeneration

    def base(self) -> PresetSpec:
        return dataclasses.replace(
            LLAVA_PRESETS[self.llava], image_size=self.image_size, patch_size=self.patch_size
        )

    @property
    def vocab_size(self) -> int:
        return self.base().vocab_size

    @property
    def max_position_embeddings(self) -> int:
        return self.base().max_position_embeddings

    def make_config(self) -> LlavaNextConfig:
        base = self.base()
        llava = base.make_config()
        config = LlavaNextConfig(
            vision_config=llava.vision_config,
            text_config=llava.text_config,
            image_grid_pinpoints=pinpoint_lists(self.grid_pinpoints),
            **llava_projector_settings(base),
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        return self.base().generation_ids()

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """``LlavaNextProcessor`` files, tokenizer files and ``preprocessor_config.json``."""
        size = self.image_size
        image_processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": size},
            crop_size={"height": size, "width": size},
            image_grid_pinpoints=pinpoint_lists(self.grid_pinpoints),
        )
        processor = LlavaNextProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            **llava_processor_settings(self.patch_size, tokenizer),
        )
        save_processor_files(out, tokenizer, image_processor, processor)


NEXT_GRIDS = ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))  # llava-v1.6's pinpoints, in crops

LLAVA_NEXT_PRESETS: dict[str, LlavaNextPresetSpec] = {
    # ~0.9M params, for CI: tiny-llava with 32x32 crops of 4x4 patches, <= 88 embeddings.
    "tiny-llava-next": LlavaNextPresetSpec("tiny-llava", 32, 8, crop_pinpoints(32, NEXT_GRIDS)),
    # ~15M params, for benchmarks: tiny-llava-small's 224x224 crops of 16x16 patches; a 720p
    # image gives 850 embeddings.
    "tiny-llava-next-small": LlavaNextPresetSpec(
        "tiny-llava-small", 224, 14, crop_pinpoints(224, NEXT_GRIDS)
    ),
}
