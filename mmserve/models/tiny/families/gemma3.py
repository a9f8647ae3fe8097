"""Tiny random-weight Gemma 3 presets: spec, HF config, tokenizer flavour and processor files.

The layout is that of ``google/gemma-3-*-it``: ``config.json`` (``Gemma3Config``: SigLIP
vision, Gemma 3 text with local/global ``layer_types``), ``generation_config.json`` (eos =
``<eos>`` and ``<end_of_turn>``), ``model.safetensors``, the tokenizer files (with
``boi_token`` / ``eoi_token`` / ``image_token``) and ``chat_template.jinja``,
``preprocessor_config.json`` (``Gemma3ImageProcessor``) and ``processor_config.json``
(``Gemma3Processor``: ``<start_of_image>`` expands to ``\\n\\n<start_of_image>`` +
``mm_tokens_per_image`` x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    PreTrainedTokenizerFast,
)

from ..build_steps import save_processor_files
from ..config_parts import decoder_sizes, siglip_vision_config
from ..sizes import BENCH_VIT, CI_VIT, TextSizes, VitSizes
from ..tokenizer import TokenizerFlavor

GEMMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
IDS = {tok: i for i, tok in enumerate(GEMMA3_SPECIAL_TOKENS)}

# google/gemma-3-*-it's chat template: bos, a system turn folded into the first user turn,
# "model" for the assistant, "<start_of_image>" per image part, text parts trimmed.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

GEMMA3 = TokenizerFlavor(
    GEMMA3_SPECIAL_TOKENS, GEMMA3_CHAT_TEMPLATE, eos="<eos>", pad="<pad>", bos="<bos>", unk="<unk>"
)


@dataclass(frozen=True)
class Gemma3PresetSpec(VitSizes, TextSizes):
    """Architecture of one Gemma 3 preset (SigLIP vision + Gemma 3 text)."""

    image_size: int
    patch_size: int
    mm_tokens_per_image: int
    head_dim: int
    sliding_window: int
    sliding_window_pattern: int  # every n-th layer is global, the others local
    # released Gemma 3 ties lm_head to the embeddings; tiny random weights tied that way
    # greedily repeat the last input token (the residual is mostly its scaled embedding)
    tie_word_embeddings: bool

    flavor: ClassVar[TokenizerFlavor] = GEMMA3
    model_class: ClassVar[type] = Gemma3ForConditionalGeneration

    def layer_types(self) -> list[str]:
        n = self.sliding_window_pattern
        return [
            "full_attention" if (i + 1) % n == 0 else "sliding_attention"
            for i in range(self.text_layers)
        ]

    def make_config(self) -> Gemma3Config:
        text = dict(
            **decoder_sizes(self),
            head_dim=self.head_dim,
            query_pre_attn_scalar=self.head_dim,
            sliding_window=self.sliding_window,
            layer_types=self.layer_types(),
            rms_norm_eps=1e-6,
            # as gemma-3-4b-it: linear scaling (factor 8) on the global layers only
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
            **self.generation_ids(),
            tie_word_embeddings=self.tie_word_embeddings,
        )
        config = Gemma3Config(
            vision_config=siglip_vision_config(self),
            text_config=text,
            mm_tokens_per_image=self.mm_tokens_per_image,
            boi_token_index=IDS["<start_of_image>"],
            eoi_token_index=IDS["<end_of_image>"],
            image_token_index=IDS["<image_soft_token>"],
            tie_word_embeddings=self.tie_word_embeddings,
        )
        config.dtype = torch.float32
        return config

    def generation_ids(self) -> dict[str, Any]:
        return {
            "bos_token_id": IDS["<bos>"],
            "eos_token_id": [IDS["<eos>"], IDS["<end_of_turn>"]],
            "pad_token_id": IDS["<pad>"],
        }

    def save_processors(self, out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
        """Tokenizer (with Gemma's named image tokens), chat template, image processor and
        ``Gemma3Processor`` files."""
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer.backend_tokenizer,
            bos_token="<bos>",
            eos_token="<eos>",
            unk_token="<unk>",
            pad_token="<pad>",
            model_max_length=tokenizer.model_max_length,
            extra_special_tokens={
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        )
        tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
        image_processor = Gemma3ImageProcessorPil(
            size={"height": self.image_size, "width": self.image_size},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        )
        processor = Gemma3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=GEMMA3_CHAT_TEMPLATE,
            image_seq_length=self.mm_tokens_per_image,
        )
        save_processor_files(out, tokenizer, image_processor, processor)


GEMMA3_PRESETS: dict[str, Gemma3PresetSpec] = {
    # ~1M params, for CI. 32x32 images, 4x4 patches pooled 2x2 -> 16 image tokens; a window of
    # 8 tokens on 2 of every 3 layers, so it cuts through images and long prompts.
    "tiny-gemma3": Gemma3PresetSpec(
        image_size=32,
        patch_size=4,
        mm_tokens_per_image=16,
        **asdict(CI_VIT),
        text_hidden=128,
        text_intermediate=256,
        text_layers=3,
        text_heads=4,
        text_kv_heads=2,
        head_dim=32,
        sliding_window=8,
        sliding_window_pattern=3,
        vocab_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
    # ~15M params, for benchmarks. 224x224 images, 14x14 patches pooled 2x2 -> 64 image
    # tokens; a window of 64 tokens, one global layer in three.
    "tiny-gemma3-small": Gemma3PresetSpec(
        image_size=224,
        patch_size=14,
        mm_tokens_per_image=64,
        **asdict(BENCH_VIT),
        text_hidden=512,
        text_intermediate=768,
        text_layers=6,
        text_heads=8,
        text_kv_heads=4,
        head_dim=64,
        sliding_window=64,
        sliding_window_pattern=3,
        vocab_size=4096,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
}
