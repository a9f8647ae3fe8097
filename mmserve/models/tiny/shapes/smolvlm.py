"""SmolVLM-256M-Instruct and SmolVLM-500M-Instruct shapes (``HuggingFaceTB``), as published.

Both are ``Idefics3ForConditionalGeneration``: a SigLIP-base-patch16-512 tower (768 wide, 12
layers; the Idefics3 vision defaults), a pixel-shuffle connector of scale 4 (64 embeddings per
512 x 512 tile), a SmolLM2 decoder (135M: 576 wide, 30 layers, 9 heads, 3 KV heads; 360M: 960
wide, 32 layers, 15 heads, 5 KV heads; head_dim 64, rope_theta 100000) with an untied
``lm_head``; one bf16 ``model.safetensors`` with the transformers names (``model.text_model.*``,
``model.vision_model.*``, ``model.connector.*``, ``lm_head``). The tokenizer has 49280 tokens:
49152 BPE tokens (``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2), then
``<global-img>`` 49152, the 36 ``<row_i_col_j>`` tags, ``<fake_token_around_image>`` 49189,
``<image>`` 49190, 88 reserved tokens and ``<end_of_utterance>`` 49279 (eos). The image
processor resizes to a 2048-pixel longest edge and splits into 512-pixel tiles
(``Idefics3Processor``, ``image_seq_len`` 64); the chat template is in ``chat_template.json``
and the tokenizer config, as the ``tiny-smolvlm-hub`` layout writes it.

Sources (no hub is reachable here): the config numbers as transcribed from the hub's
``config.json`` / ``preprocessor_config.json`` / ``processor_config.json`` / added tokens in
public test fixtures (SmolVLM2-500M-Video-Instruct's ``config.json``, which shares the
500M-Instruct text and vision sizes and the tokenizer; an Idefics3 config test with the
256M-Instruct sizes), and the model cards (256M / 500M parameters, 64 visual tokens per 512 x 512
patch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from ..families.idefics3 import TILE_TAGS, save_smolvlm_processors, smolvlm_hub
from .spec import GB, ShapeSpec, TokenLayout

SMOLVLM_TILE = 512
SMOLVLM_LONGEST_EDGE = 4 * SMOLVLM_TILE
SMOLVLM_IMAGE_SEQ_LEN = 64  # (512 / 16) ** 2 patches / 4 ** 2
FIRST_ADDED = 49152
SMOLVLM_TOKENS = TokenLayout(
    size=49280,
    specials={
        "<|endoftext|>": 0,
        "<|im_start|>": 1,
        "<|im_end|>": 2,
        "<global-img>": FIRST_ADDED,
        **{tag: FIRST_ADDED + 1 + i for i, tag in enumerate(TILE_TAGS)},
        "<fake_token_around_image>": 49189,
        "<image>": 49190,
        **{f"<|reserved_special_token_{i}|>": 49191 + i for i in range(88)},
        "<end_of_utterance>": 49279,
    },
    eos="<end_of_utterance>",
    pad="<|im_end|>",
    unk="<|endoftext|>",
    model_max_length=8192,
)


def write_smolvlm_processors(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """2048-pixel images in 512-pixel tiles, 64 embeddings a tile, the hub's template files."""
    save_smolvlm_processors(
        out, tokenizer, SMOLVLM_LONGEST_EDGE, SMOLVLM_TILE, SMOLVLM_IMAGE_SEQ_LEN
    )
    smolvlm_hub(out)


def smolvlm_config(**text_sizes: Any) -> dict[str, Any]:
    """``config.json`` of a SmolVLM-Instruct checkpoint with the decoder sizes ``text_sizes``;
    everything else both published configs share."""
    text = {
        "architectures": ["VLlama3ForCausalLM"],
        "head_dim": 64,
        "is_llama_config": True,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "neftune_noise_alpha": 0.0,
        "pad_token_id": 2,
        "pixel_shuffle_factor": 4,
        "qk_layer_norms": False,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": False,
        "rope_theta": 100000,
        "torch_dtype": "bfloat16",
        "use_resampler": False,
        "vocab_size": 49280,
        **text_sizes,
    }
    vision = {
        "hidden_size": 768,
        "image_size": SMOLVLM_TILE,
        "intermediate_size": 3072,
        "max_image_size": {"longest_edge": SMOLVLM_TILE},
        "model_type": "idefics3",
        "num_attention_heads": 12,
        "patch_size": 16,
        "size": {"longest_edge": SMOLVLM_LONGEST_EDGE},
        "tie_word_embeddings": False,
        "use_base_siglip": False,
    }
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "image_token_id": 49190,
        "model_type": "idefics3",
        "scale_factor": 4,
        "text_config": text,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vision_config": vision,
        "vocab_size": 49280,
    }


def smolvlm_shape(size: str, published_params: int, **text_sizes: Any) -> ShapeSpec:
    """The ``HuggingFaceTB/SmolVLM-{size}-Instruct`` shape."""
    return ShapeSpec(
        hub_repo=f"HuggingFaceTB/SmolVLM-{size}-Instruct",
        config=smolvlm_config(**text_sizes),
        model_class="Idefics3ForConditionalGeneration",
        published_params=published_params,
        max_shard_bytes=5 * GB,
        hub_names=(),  # published under the transformers names
        tokens=SMOLVLM_TOKENS,
        generation_config={"bos_token_id": 1, "eos_token_id": 49279, "pad_token_id": 2},
        write_processors=write_smolvlm_processors,
    )


SMOLVLM_256M = smolvlm_shape(
    "256M",
    published_params=256_484_928,  # 513 MB of bf16 weights; the hub page rounds it: 256M
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_hidden_layers=30,
    num_key_value_heads=3,
)
SMOLVLM_500M = smolvlm_shape(
    "500M",
    published_params=507_482_304,  # 1.02 GB of bf16 weights; the hub page rounds it: 508M
    hidden_size=960,
    intermediate_size=2560,
    num_attention_heads=15,
    num_hidden_layers=32,
    num_key_value_heads=5,
)
