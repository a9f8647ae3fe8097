"""Tiny random-weight SmolVLM presets (the Idefics3 architecture): spec, HF config, tokenizer
flavour and processor files.

The layout is that of ``HuggingFaceTB/SmolVLM-256M-Instruct``: ``config.json``
(``Idefics3Config``: an Idefics3 vision tower, i.e. SigLIP with variable-size position ids, a
pixel-shuffle connector of ``scale_factor``, a Llama decoder), ``generation_config.json`` (eos
= ``<end_of_utterance>``), ``model.safetensors``, the tokenizer files (``<|im_start|>`` as bos,
written by the template and never added by the tokenizer; ``<fake_token_around_image>``,
``<image>``, ``<global-img>``, the 36 ``<row_i_col_j>`` tile tags and ``<end_of_utterance>``),
``preprocessor_config.json`` (``Idefics3ImageProcessor``: the image resized to ``longest_edge``,
then split into ``max_image_size`` tiles plus the whole image at that size) and
``processor_config.json`` (``Idefics3Processor``: ``image_seq_len``), the published chat
template in both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    PreTrainedTokenizerFast,
)

from ..build_steps import edit_json, save_processor_files, write_hub_chat_template, write_json
from ..config_parts import decoder_sizes
from ..sizes import CI_TEXT, CI_VIT, TextSizes, VitSizes
from ..tokenizer import TokenizerFlavor

TILE_TAGS = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
SMOLVLM_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *TILE_TAGS,
)
IDS = {tok: i for i, tok in enumerate(SMOLVLM_SPECIAL_TOKENS)}

# HuggingFaceTB/SmolVLM-256M-Instruct's chat template, as published: "User:" / "Assistant:"
# turns, "<image>" per image part, content read only as a list of parts.
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

SMOLVLM = TokenizerFlavor(
    SMOLVLM_SPECIAL_TOKENS,
    SMOLVLM_CHAT_TEMPLATE,
    eos="<end_of_utterance>",
    pad="<|im_end|>",
    unk="<|endoftext|>",
)


@dataclass(frozen=True)
class Idefics3PresetSpec(VitSizes, TextSizes):
    """Architecture of one SmolVLM preset. The vision tower takes ``image_size`` pixels a side
    (the processor's ``max_image_size``, its tile); an image is first resized so its longest
    edge is ``longest_edge``, so it has up to ``longest_edge // image_size`` tiles a side."""

    image_size: int
    patch_size: int
    scale_factor: int
    longest_edge: int

    flavor: ClassVar[TokenizerFlavor] = SMOLVLM
    model_class: ClassVar[type] = Idefics3ForConditionalGeneration

    @property
    def image_seq_len(self) -> int:
        """Embeddings per tile: the patches after the pixel shuffle."""
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2

    def make_config(self) -> Idefics3Config:
        text = dict(
            model_type="llama",
            **decoder_sizes(self),
            hidden_act="silu",
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            tie_word_embeddings=False,
            **self.generation_ids(),
        )
        vision = dict(
            model_type="idefics3_vision",
            hidden_size=self.vision_hidden,
            intermediate_size=self.vision_intermediate,
            num_hidden_layers=self.vision_layers,
            num_attention_heads=self.vision_heads,
            image_size=self.image_size,
            patch_size=self.patch_size,
        )
        config = Idefics3Config(
            vision_config=vision,
            text_config=text,
            scale_factor=self.scale_factor,
            image_token_id=IDS["<image>"],
            tie_word_embeddings=False,
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        return {
            "bos_token_id": IDS["<|im_start|>"],
            "eos_token_id": IDS["<end_of_utterance>"],
            "pad_token_id": IDS["<|im_end|>"],
        }

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """The processor files of ``save_smolvlm_processors`` at this preset's sizes."""
        save_smolvlm_processors(
            out, tokenizer, self.longest_edge, self.image_size, self.image_seq_len
        )


def save_smolvlm_processors(
    out: Path, tokenizer: PreTrainedTokenizerFast, longest_edge: int, tile: int, seq_len: int
) -> None:
    """Tokenizer (with SmolVLM's named image tokens), image processor (images resized to
    ``longest_edge``, split into ``tile``-pixel tiles) and ``Idefics3Processor`` (``seq_len``
    embeddings a tile) files, the chat template in both; the tiny presets and the real-size
    shapes write them alike."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
        model_max_length=tokenizer.model_max_length,
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    tokenizer.chat_template = SMOLVLM_CHAT_TEMPLATE
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": longest_edge},
        max_image_size={"longest_edge": tile},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=seq_len,
        chat_template=SMOLVLM_CHAT_TEMPLATE,
    )
    save_processor_files(out, tokenizer, image_processor, processor)


IDEFICS3_PRESETS: dict[str, Idefics3PresetSpec] = {
    # ~1M params, for CI. 64x64 tiles of 4x4 patches, shuffled 4x4 (SmolVLM's scale factor)
    # -> 16 embeddings a tile; images resized to 192 pixels on their long side: up to 3x3
    # tiles plus the whole image.
    "tiny-smolvlm": Idefics3PresetSpec(
        image_size=64,
        patch_size=4,
        scale_factor=4,
        longest_edge=192,
        **asdict(CI_VIT),
        **asdict(CI_TEXT),
    ),
}


# HuggingFaceTB/SmolVLM2-*-Video-Instruct's chat template, as published (SmolVLM's plus a
# "<video>" per video part).
SMOLVLM2_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}"
    "{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def smolvlm_hub(out: Path) -> None:
    """SmolVLM-256M-Instruct's files: the template in ``chat_template.json`` and the
    tokenizer config (none in ``chat_template.jinja``)."""
    (out / "chat_template.jinja").unlink(missing_ok=True)
    write_hub_chat_template(out, SMOLVLM_CHAT_TEMPLATE)


def smolvlm2_hub(out: Path) -> None:
    """SmolVLM2-*-Video-Instruct's files: ``SmolVLMForConditionalGeneration`` (model types
    ``smolvlm`` / ``smolvlm_vision``), ``SmolVLMImageProcessor`` with its ``video_sampling``,
    ``SmolVLMProcessor``, the video-aware template; the weights are the same."""
    smolvlm_hub(out)
    write_hub_chat_template(out, SMOLVLM2_CHAT_TEMPLATE)

    def config(data: dict[str, Any]) -> None:
        data.update(architectures=["SmolVLMForConditionalGeneration"], model_type="smolvlm")
        data["vision_config"]["model_type"] = "smolvlm_vision"

    def preprocessor(data: dict[str, Any]) -> None:
        tile = data["max_image_size"]["longest_edge"]
        data.update(
            image_processor_type="SmolVLMImageProcessor",
            processor_class="SmolVLMProcessor",
            video_sampling={"fps": 1, "max_frames": 64, "video_size": {"longest_edge": tile}},
        )

    edit_json(out / "config.json", config)
    edit_json(out / "preprocessor_config.json", preprocessor)
    seq = json.loads((out / "processor_config.json").read_text())["image_seq_len"]
    write_json(
        out / "processor_config.json", {"image_seq_len": seq, "processor_class": "SmolVLMProcessor"}
    )
