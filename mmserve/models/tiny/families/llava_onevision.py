"""Tiny random-weight LLaVA-OneVision presets: SigLIP tower + Qwen2 decoder, anyres images.

The layout is that of ``llava-hf/llava-onevision-qwen2-*-ov-hf`` minus its video processor
config (the video processor needs torchvision): ``config.json`` (``LlavaOnevisionConfig``),
``generation_config.json``, ``model.safetensors``, the Qwen2 tokenizer files with ``<image>``
and ``<video>`` added, the hub's chat template (images first, then text; parts only) in
``chat_template.json`` and ``tokenizer_config.json``, ``preprocessor_config.json``
(``LlavaOnevisionImageProcessor``) and ``processor_config.json`` (``LlavaOnevisionProcessor``:
``num_image_tokens``, ``vision_aspect_ratio``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    AutoTokenizer,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    LlavaOnevisionProcessor,
    PreTrainedTokenizerFast,
)

from ..build_steps import save_processor_files, write_hub_chat_template, write_json
from ..config_parts import (
    chatml_generation_ids,
    crop_pinpoints,
    pinpoint_lists,
    qwen2_text_config,
    siglip_vision_config,
)
from ..sizes import BENCH_TEXT, BENCH_VIT, CI_TEXT, CI_VIT, TextSizes, VitSizes
from ..tokenizer import QWEN_SPECIAL_TOKENS, TokenizerFlavor

# llava-hf/llava-onevision-qwen2-*-ov-hf's chat template, as published.
ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\\n' + content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ONEVISION_SPECIAL_TOKENS = (*QWEN_SPECIAL_TOKENS, "<image>", "<video>")
ONEVISION = TokenizerFlavor(
    ONEVISION_SPECIAL_TOKENS, ONEVISION_CHAT_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>"
)
IDS = {tok: i for i, tok in enumerate(ONEVISION_SPECIAL_TOKENS)}


@dataclass(frozen=True)
class OnevisionPresetSpec(VitSizes, TextSizes):
    """Architecture and anyres settings of one LLaVA-OneVision preset; pinpoints are
    (height, width) multiples of ``image_size``."""

    image_size: int
    patch_size: int
    grid_pinpoints: tuple[tuple[int, int], ...]
    vision_aspect_ratio: str

    flavor: ClassVar[TokenizerFlavor] = ONEVISION
    model_class: ClassVar[type] = LlavaOnevisionForConditionalGeneration

    @property
    def patches_per_crop(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def make_config(self) -> LlavaOnevisionConfig:
        text = dict(
            model_type="qwen2",
            **qwen2_text_config(self, rope={}),
            tie_word_embeddings=False,
        )
        config = LlavaOnevisionConfig(
            vision_config=siglip_vision_config(self),
            text_config=text,
            image_token_index=IDS["<image>"],
            video_token_index=IDS["<video>"],
            projector_hidden_act="gelu",
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            image_grid_pinpoints=pinpoint_lists(self.grid_pinpoints),
            vision_aspect_ratio=self.vision_aspect_ratio,
            tie_word_embeddings=False,
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        return chatml_generation_ids()

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """Tokenizer files, processor and preprocessor configs, and the chat template where the
        hub keeps it (``chat_template.json`` and the tokenizer config)."""
        image_processor = LlavaOnevisionImageProcessorPil(
            size={"height": self.image_size, "width": self.image_size},
            image_grid_pinpoints=pinpoint_lists(self.grid_pinpoints),
        )
        tokenizer.chat_template = None
        save_processor_files(out, tokenizer, image_processor)
        processor_config = {
            "image_token": "<image>",
            "num_image_tokens": self.patches_per_crop,
            "processor_class": "LlavaOnevisionProcessor",
            "video_token": "<video>",
            "vision_aspect_ratio": self.vision_aspect_ratio,
            "vision_feature_select_strategy": "full",
        }
        write_json(out / "processor_config.json", processor_config)
        write_hub_chat_template(out, ONEVISION_CHAT_TEMPLATE)


ONEVISION_PRESETS: dict[str, OnevisionPresetSpec] = {
    # ~1M params, for CI. 32x32 crops of 4x4 patches (16 embeddings); grids up to 3x3, capped at
    # 4 crops' worth ("anyres_max_4"), so 3x3 and 2x3 grids are shrunk: <= 88 embeddings.
    "tiny-llava-onevision": OnevisionPresetSpec(
        image_size=32,
        patch_size=8,
        **asdict(CI_VIT),
        **asdict(CI_TEXT),
        grid_pinpoints=crop_pinpoints(
            32, ((1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (2, 3), (3, 2), (3, 3))
        ),
        vision_aspect_ratio="anyres_max_4",
    ),
    # ~16M params, for benchmarks. 224x224 crops of 14x14 patches (196 embeddings), grids up to
    # 2x2 / 1x3 / 3x1 and the released cap ("anyres_max_9"): a 720p image gives 660 embeddings.
    "tiny-llava-onevision-small": OnevisionPresetSpec(
        image_size=224,
        patch_size=16,
        **asdict(BENCH_VIT),
        **asdict(BENCH_TEXT),
        grid_pinpoints=crop_pinpoints(224, ((1, 1), (1, 2), (2, 1), (2, 2), (1, 3), (3, 1))),
        vision_aspect_ratio="anyres_max_9",
    ),
}


class ImageOnlyOnevisionProcessor(LlavaOnevisionProcessor):
    """``LlavaOnevisionProcessor`` without a video processor: its class needs torchvision, so
    transformers' own loading fails beside a CPU-only torch."""

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def load_onevision_processor(path: Path) -> LlavaOnevisionProcessor:
    """The checkpoint's processor (tokenizer, PIL image processor, ``processor_config.json``
    and the ``chat_template.json`` its ``apply_chat_template`` renders)."""
    settings = json.loads((path / "processor_config.json").read_text())
    settings.pop("processor_class", None)
    template = json.loads((path / "chat_template.json").read_text())["chat_template"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    return ImageOnlyOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessorPil.from_pretrained(path),
        tokenizer=tokenizer,
        chat_template=template,
        **settings,
    )
