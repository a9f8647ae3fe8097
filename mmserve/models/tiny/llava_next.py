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
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    PreTrainedTokenizerFast,
)

from .tokenizer import IMAGE, LLAVA, SPECIAL_TOKEN_IDS, TokenizerFlavor

if TYPE_CHECKING:
    from .presets import PresetSpec


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
        from .presets import PRESETS, PresetSpec  # presets.py imports this module

        spec = PRESETS[self.llava]
        assert isinstance(spec, PresetSpec)
        return dataclasses.replace(spec, image_size=self.image_size, patch_size=self.patch_size)

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
            image_token_index=SPECIAL_TOKEN_IDS[IMAGE],
            image_seq_length=base.num_image_tokens,
            projector_hidden_act="gelu",
            vision_feature_select_strategy="default",
            vision_feature_layer=-2,
            image_grid_pinpoints=[list(p) for p in self.grid_pinpoints],
            multimodal_projector_bias=True,
            tie_word_embeddings=False,
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
            image_grid_pinpoints=[list(p) for p in self.grid_pinpoints],
        )
        processor = LlavaNextProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=self.patch_size,
            vision_feature_select_strategy="default",
            chat_template=tokenizer.chat_template,
            image_token=IMAGE,
            num_additional_image_tokens=1,  # CLIP's CLS, which "default" drops again
        )
        processor.save_pretrained(out)
        tokenizer.save_pretrained(out)
        image_processor.save_pretrained(out)


def _pinpoints(crop: int, grids: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple((rows * crop, cols * crop) for rows, cols in grids)


NEXT_GRIDS = ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))  # llava-v1.6's pinpoints, in crops

LLAVA_NEXT_PRESETS: dict[str, LlavaNextPresetSpec] = {
    # ~0.9M params, for CI: tiny-llava with 32x32 crops of 4x4 patches, <= 88 embeddings.
    "tiny-llava-next": LlavaNextPresetSpec("tiny-llava", 32, 8, _pinpoints(32, NEXT_GRIDS)),
    # ~15M params, for benchmarks: tiny-llava-small's 224x224 crops of 16x16 patches; a 720p
    # image gives 850 embeddings.
    "tiny-llava-next-small": LlavaNextPresetSpec(
        "tiny-llava-small", 224, 14, _pinpoints(224, NEXT_GRIDS)
    ),
}
