"""Qwen2-VL-2B-Instruct and Qwen2.5-VL-3B-Instruct shapes, as published on the hub.

Both ship ``config.json`` in the flat pre-transformers-5 form (text fields at the top level,
``rope_scaling`` of type ``mrope``), two bf16 shards of at most 4 GB with the names
``model.layers.*`` / ``model.embed_tokens`` / ``visual.*`` (no ``lm_head``: the embeddings are
tied), the Qwen2 tokenizer (151643 BPE tokens, then the specials), ``preprocessor_config.json``
(``min_pixels`` 3136, ``max_pixels`` 12845056) and the chat template in ``chat_template.json``
and the tokenizer config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessorPil

from ..build_steps import save_processor_files, write_hub_chat_template
from ..hub_layouts import QWEN2_VL_HUB_TEMPLATE
from .spec import GB, ShapeSpec, TokenLayout

QWEN2_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN2_5_EXTRA = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
FIRST_SPECIAL = 151643
QWEN_HUB_NAMES = ((r"^model\.language_model\.", "model."), (r"^model\.visual\.", "visual."))


def qwen_tokens(specials: tuple[str, ...]) -> TokenLayout:
    ids = {tok: FIRST_SPECIAL + i for i, tok in enumerate(specials)}
    return TokenLayout(size=FIRST_SPECIAL + len(specials), specials=ids, eos="<|im_end|>",
                       pad="<|endoftext|>")  # fmt: skip


def write_qwen_processors(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """``preprocessor_config.json`` with the published pixel limits, and the template."""
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    tokenizer.chat_template = None
    save_processor_files(out, tokenizer, image_processor)
    write_hub_chat_template(out, QWEN2_VL_HUB_TEMPLATE)


def qwen_text(**sizes: Any) -> dict[str, Any]:
    """The top-level (text) fields both published configs share."""
    return {
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": 151936,
        **sizes,
    }


QWEN2_VL_2B = ShapeSpec(
    hub_repo="Qwen/Qwen2-VL-2B-Instruct",
    config={
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **qwen_text(
            hidden_size=1536,
            intermediate_size=8960,
            max_position_embeddings=32768,
            max_window_layers=28,
            num_attention_heads=12,
            num_hidden_layers=28,
        ),
        "vision_config": {
            "depth": 32,
            "embed_dim": 1280,
            "mlp_ratio": 4,
            "num_heads": 16,
            "in_chans": 3,
            "hidden_size": 1536,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "temporal_patch_size": 2,
        },
    },  # fmt: skip
    model_class="Qwen2VLForConditionalGeneration",
    published_params=2_208_985_600,
    max_shard_bytes=4 * GB,
    hub_names=QWEN_HUB_NAMES,
    tokens=qwen_tokens(QWEN2_SPECIALS),
    generation_config={
        "bos_token_id": 151643,
        "pad_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "repetition_penalty": 1.0,
        "temperature": 0.01,
        "top_p": 0.001,
        "top_k": 1,
    },  # fmt: skip
    write_processors=write_qwen_processors,
)

QWEN2_5_VL_3B = ShapeSpec(
    hub_repo="Qwen/Qwen2.5-VL-3B-Instruct",
    config={
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **qwen_text(
            hidden_size=2048,
            intermediate_size=11008,
            max_position_embeddings=128000,
            max_window_layers=70,
            num_attention_heads=16,
            num_hidden_layers=36,
        ),
        "vision_config": {
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
    },  # fmt: skip
    model_class="Qwen2_5_VLForConditionalGeneration",
    published_params=3_754_622_976,
    max_shard_bytes=4 * GB,
    hub_names=QWEN_HUB_NAMES,
    tokens=qwen_tokens(QWEN2_SPECIALS + QWEN2_5_EXTRA),
    generation_config={
        "bos_token_id": 151643,
        "pad_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "repetition_penalty": 1.05,
        "temperature": 0.1,
        "top_p": 0.001,
        "top_k": 1,
    },  # fmt: skip
    write_processors=write_qwen_processors,
)
