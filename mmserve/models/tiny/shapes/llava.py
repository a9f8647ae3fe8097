"""LLaVA-1.5-7B and LLaVA-OneVision-Qwen2-0.5B shapes (``llava-hf``), as published.

Both use the pre-transformers-5 names: ``language_model.model.*``, ``language_model.lm_head``,
``vision_tower.vision_model.*``, ``multi_modal_projector.*`` (and OneVision's
``image_newline``). LLaVA-1.5-7B ships three float16 shards of at most 5 GB, the LLaMA
tokenizer (32000 tokens, then ``<image>`` 32000 and ``<pad>`` 32001; the embeddings padded to
32064 rows), a CLIP-336 image processor and ``LlavaProcessor``. OneVision-0.5B ships one bf16
``model.safetensors`` (under the shard limit), the Qwen2 tokenizer with ``<image>`` 151646 and
``<video>`` 151647, a SigLIP-384 anyres image processor (grids up to 6 x 6 crops,
``anyres_max_9``) and ``LlavaOnevisionProcessor`` settings.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    CLIPImageProcessorPil,
    LlavaOnevisionImageProcessorPil,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from ..build_steps import save_processor_files, write_hub_chat_template, write_json
from ..families.llava_onevision import ONEVISION_CHAT_TEMPLATE
from ..hub_layouts import LLAVA_HUB_TEMPLATE
from .spec import GB, ShapeSpec, TokenLayout

LLAVA_HUB_NAMES = (
    (r"^model\.language_model\.", "language_model.model."),
    (r"^lm_head\.", "language_model.lm_head."),
    (r"^model\.vision_tower\.vision_model\.", "vision_tower.vision_model."),
    (r"^model\.vision_tower\.", "vision_tower.vision_model."),
    (r"^model\.", ""),
)
ONEVISION_CROP = 384
ONEVISION_PINPOINTS = [
    [rows * ONEVISION_CROP, cols * ONEVISION_CROP] for rows in range(1, 7) for cols in range(1, 7)
]


def write_llava_processors(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """CLIP-336 preprocessing, ``LlavaProcessor`` (576 image tokens) and the hub template
    (only in ``chat_template.json``)."""
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    tokenizer.chat_template = None
    save_processor_files(out, tokenizer, image_processor, processor)
    write_json(out / "chat_template.json", {"chat_template": LLAVA_HUB_TEMPLATE})


def write_onevision_processors(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """SigLIP-384 anyres preprocessing, the processor settings and the hub template."""
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": ONEVISION_CROP, "width": ONEVISION_CROP},
        image_grid_pinpoints=ONEVISION_PINPOINTS,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    tokenizer.chat_template = None
    save_processor_files(out, tokenizer, image_processor)
    processor_config = {
        "image_token": "<image>",
        "num_image_tokens": (ONEVISION_CROP // 14) ** 2,
        "processor_class": "LlavaOnevisionProcessor",
        "video_token": "<video>",
        "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full",
    }
    write_json(out / "processor_config.json", processor_config)
    write_hub_chat_template(out, ONEVISION_CHAT_TEMPLATE)


LLAVA_1_5_7B = ShapeSpec(
    hub_repo="llava-hf/llava-1.5-7b-hf",
    config={
        "architectures": ["LlavaForConditionalGeneration"],
        "ignore_index": -100,
        "image_token_index": 32000,
        "model_type": "llava",
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "text_config": {
            "_name_or_path": "lmsys/vicuna-7b-v1.5",
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096,
            "model_type": "llama",
            "rms_norm_eps": 1e-05,
            "torch_dtype": "float16",
            "vocab_size": 32064,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vision_config": {
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "model_type": "clip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
            "vocab_size": 32000,
        },
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "vocab_size": 32064,
    },
    model_class="LlavaForConditionalGeneration",
    published_params=7_063_427_072,
    max_shard_bytes=5 * GB,
    hub_names=LLAVA_HUB_NAMES,
    tokens=TokenLayout(
        size=32002,
        specials={"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001},
        eos="</s>",
        pad="<pad>",
        bos="<s>",
        unk="<unk>",
        model_max_length=4096,
    ),
    generation_config={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 32001},
    write_processors=write_llava_processors,
)

LLAVA_ONEVISION_0_5B = ShapeSpec(
    hub_repo="llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
    config={
        "architectures": ["LlavaOnevisionForConditionalGeneration"],
        "image_grid_pinpoints": ONEVISION_PINPOINTS,
        "image_token_index": 151646,
        "model_type": "llava_onevision",
        "projector_hidden_act": "gelu",
        "text_config": {
            "_name_or_path": "Qwen/Qwen2-0.5B-Instruct",
            "architectures": ["Qwen2ForCausalLM"],
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "max_position_embeddings": 32768,
            "max_window_layers": 24,
            "model_type": "qwen2",
            "num_attention_heads": 14,
            "num_hidden_layers": 24,
            "num_key_value_heads": 2,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "use_sliding_window": False,
            "vocab_size": 152000,
        },
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_image_newline_parameter": True,
        "video_token_index": 151647,
        "vision_aspect_ratio": "anyres_max_9",
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 384,
            "intermediate_size": 4304,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 26,
            "patch_size": 14,
            "vision_use_head": False,
        },
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
    },
    model_class="LlavaOnevisionForConditionalGeneration",
    published_params=894_000_000,  # the hub page rounds it: "894M params"
    max_shard_bytes=5 * GB,
    hub_names=LLAVA_HUB_NAMES,
    tokens=TokenLayout(
        size=151648,
        specials={
            "<|endoftext|>": 151643,
            "<|im_start|>": 151644,
            "<|im_end|>": 151645,
            "<image>": 151646,
            "<video>": 151647,
        },  # fmt: skip
        eos="<|im_end|>",
        pad="<|endoftext|>",
    ),
    generation_config={"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643},
    write_processors=write_onevision_processors,
)
