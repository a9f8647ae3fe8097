"""The Gemma-3-4B-it shape, as published (``google/gemma-3-4b-it``).

Its ``config.json`` names only what differs from the ``Gemma3TextConfig`` defaults (8 heads,
4 KV heads, head_dim 256, vocab 262208, one global layer in six); two bf16 shards of at most
5 GB with the pre-transformers-5 names (``language_model.model.*``,
``vision_tower.vision_model.*``, ``multi_modal_projector.*``; ``lm_head`` tied, absent);
the Gemma tokenizer (262144 tokens plus ``<image_soft_token>`` 262144; ``<start_of_turn>`` 105,
``<end_of_turn>`` 106, ``<start_of_image>`` 255999, ``<end_of_image>`` 256000), an 896 x 896
SigLIP image processor and ``Gemma3Processor`` (256 tokens per image).
"""

from __future__ import annotations

from pathlib import Path

from transformers import Gemma3ImageProcessorPil, Gemma3Processor, PreTrainedTokenizerFast

from ..build_steps import save_processor_files
from ..families.gemma3 import GEMMA3_CHAT_TEMPLATE
from .llava import LLAVA_HUB_NAMES
from .spec import GB, ShapeSpec, TokenLayout


def write_gemma3_processors(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """896 x 896 preprocessing and ``Gemma3Processor`` with the template."""
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    image_processor = Gemma3ImageProcessorPil(
        size={"height": 896, "width": 896}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=256,
    )
    save_processor_files(out, tokenizer, image_processor, processor)


GEMMA_3_4B = ShapeSpec(
    hub_repo="google/gemma-3-4b-it",
    config={
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": [1, 106],
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 896,
            "intermediate_size": 4304,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 27,
            "patch_size": 14,
            "vision_use_head": False,
        },
    },
    model_class="Gemma3ForConditionalGeneration",
    published_params=4_300_079_472,
    max_shard_bytes=5 * GB,
    hub_names=LLAVA_HUB_NAMES,
    tokens=TokenLayout(
        size=262145,
        specials={
            "<pad>": 0,
            "<eos>": 1,
            "<bos>": 2,
            "<unk>": 3,
            "<start_of_turn>": 105,
            "<end_of_turn>": 106,
            "<start_of_image>": 255999,
            "<end_of_image>": 256000,
            "<image_soft_token>": 262144,
        },  # fmt: skip
        eos="<eos>",
        pad="<pad>",
        bos="<bos>",
        unk="<unk>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },  # fmt: skip
        model_max_length=131072,
    ),
    generation_config={
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "do_sample": True,
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
        "top_k": 64,
        "top_p": 0.95,
    },  # fmt: skip
    write_processors=write_gemma3_processors,
)
