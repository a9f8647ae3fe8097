"""Tiny random-weight checkpoints ("presets") built locally in the Hugging Face layout.

LLaVA-1.5 presets (``PresetSpec``): ``build_preset(name, out_dir)`` writes ``config.json``,
``generation_config.json``, ``model.safetensors`` (float32), the tokenizer files with
``chat_template.jinja``, ``preprocessor_config.json`` (``CLIPImageProcessorPil``) and
``processor_config.json`` (``LlavaProcessor``), all loadable with ``transformers``'
``from_pretrained(out_dir)``. Qwen2-VL presets (``Qwen2VLPresetSpec``, see ``qwen2_vl.py``) share
the weight drawing, tokenizer training and build steps. Builds are deterministic: the same name
always gives byte-identical files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from .gemma3 import GEMMA3_PRESETS, Gemma3PresetSpec
from .llava_next import LLAVA_NEXT_PRESETS, LlavaNextPresetSpec
from .llava_onevision import ONEVISION_PRESETS, OnevisionPresetSpec
from .qwen2_5_vl import QWEN2_5_VL_PRESETS
from .qwen2_vl import QWEN2_VL_PRESETS, Qwen2VLPresetSpec
from .qwen3_vl import QWEN3_VL_PRESETS
from .tokenizer import (
    BOS,
    EOS,
    IMAGE,
    LLAVA,
    PAD,
    SPECIAL_TOKEN_IDS,
    TokenizerFlavor,
    build_tokenizer,
)

BUILD_VERSION = 2  # bump whenever the bytes a build writes change (invalidates caches)
SEED = 20240601
WEIGHT_STD = 0.2  # HF's default 0.02 makes a tiny LLaVA greedily repeat a single token
BIAS_STD = 0.02
MARKER_FILE = "mmserve_preset.json"


@dataclass(frozen=True)
class PresetSpec:
    """Architecture of one preset (CLIP vision tower + LLaMA text model)."""

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    vocab_size: int
    max_position_embeddings: int

    flavor: ClassVar[TokenizerFlavor] = LLAVA
    model_class: ClassVar[type] = LlavaForConditionalGeneration

    @property
    def num_image_tokens(self) -> int:
        """Image embeddings per image (CLS dropped by ``vision_feature_select_strategy``)."""
        return (self.image_size // self.patch_size) ** 2

    def make_config(self) -> LlavaConfig:
        return _make_llava_config(self)

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
            patch_size=self.patch_size,
            vision_feature_select_strategy="default",
            chat_template=tokenizer.chat_template,
            image_token=IMAGE,
            # LlavaProcessor counts (patches + additional) - 1 for the "default" strategy, so
            # the CLS token must be declared here to get exactly num_image_tokens placeholders.
            num_additional_image_tokens=1,
        )
        processor.save_pretrained(out)  # tokenizer files, chat_template.jinja, processor_config
        tokenizer.save_pretrained(out)
        image_processor.save_pretrained(out)  # preprocessor_config.json


AnySpec = (
    PresetSpec | Qwen2VLPresetSpec | OnevisionPresetSpec | LlavaNextPresetSpec | Gemma3PresetSpec
)

PRESETS: dict[str, AnySpec] = {
    # ~0.87M params, for CI. 64x64 images, 4x4 patches -> 256 image tokens.
    "tiny-llava": PresetSpec(
        image_size=64,
        patch_size=4,
        vision_hidden=32,
        vision_layers=2,
        vision_heads=2,
        vision_intermediate=64,
        text_hidden=128,
        text_intermediate=256,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        vocab_size=2048,
        max_position_embeddings=4096,
    ),
    # ~15M params, for benchmarks. 224x224 images, 14x14 patches -> 256 image tokens.
    "tiny-llava-small": PresetSpec(
        image_size=224,
        patch_size=14,
        vision_hidden=192,
        vision_layers=4,
        vision_heads=4,
        vision_intermediate=768,
        text_hidden=512,
        text_intermediate=896,
        text_layers=4,
        text_heads=8,
        text_kv_heads=4,
        vocab_size=4096,
        max_position_embeddings=8192,
    ),
    **QWEN2_VL_PRESETS,
    **QWEN2_5_VL_PRESETS,
    **QWEN3_VL_PRESETS,
    **ONEVISION_PRESETS,
    **LLAVA_NEXT_PRESETS,
    **GEMMA3_PRESETS,
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def get_spec(name: str) -> AnySpec:
    """Return the spec of preset ``name`` or raise ``ValueError`` listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}"
        ) from None


def make_config(spec: AnySpec) -> Any:
    """The HF config of ``spec`` (``LlavaConfig`` or ``Qwen2VLConfig``)."""
    return spec.make_config()


def _make_llava_config(spec: PresetSpec) -> LlavaConfig:
    """Build the ``LlavaConfig`` (with its CLIP vision and LLaMA text sub-configs) for ``spec``."""
    vision = CLIPVisionConfig(
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        num_channels=3,
        projection_dim=spec.vision_hidden,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    )
    text = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        head_dim=spec.text_hidden // spec.text_heads,
        hidden_act="silu",
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=SPECIAL_TOKEN_IDS[BOS],
        eos_token_id=SPECIAL_TOKEN_IDS[EOS],
        pad_token_id=SPECIAL_TOKEN_IDS[PAD],
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=SPECIAL_TOKEN_IDS[IMAGE],
        image_seq_length=spec.num_image_tokens,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
    )
    config.dtype = torch.float32
    return config


def count_parameters(name: str) -> int:
    """Total parameter count of preset ``name`` (counted on the meta device, no weights)."""
    spec = get_spec(name)
    with torch.device("meta"):
        model = spec.model_class(spec.make_config())
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def randomize_weights(model: nn.Module, seed: int = SEED) -> None:
    """Re-draw every weight deterministically: matrices ~N(0, 0.2), norms = 1, biases small."""
    gen = torch.Generator().manual_seed(seed)
    norm_params: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm"):
            norm_params.update(id(p) for p in module.parameters(recurse=False))
    for name, param in model.named_parameters():
        if id(param) in norm_params:
            param.fill_(0.0 if name.endswith("bias") else 1.0)
        elif param.ndim >= 2 or not name.endswith("bias"):  # incl. CLIP class_embedding
            param.copy_(torch.randn(param.shape, generator=gen) * WEIGHT_STD)
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * BIAS_STD)


def build_model(name: str) -> nn.Module:
    """Construct preset ``name`` in float32 with deterministic random weights."""
    spec = get_spec(name)
    config = spec.make_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = spec.model_class(config).to(torch.float32)
    randomize_weights(model)
    model.generation_config = GenerationConfig(**spec.generation_ids(), do_sample=False)
    return model.eval()


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' "Writing model shards" tqdm bar while saving."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_preset(name: str, out_dir: str | Path) -> Path:
    """Write the complete checkpoint of preset ``name`` into ``out_dir`` and return it."""
    spec = get_spec(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size, spec.max_position_embeddings, spec.flavor)
    model: Any = build_model(name)
    with _quiet_progress_bars():
        model.save_pretrained(out)
    spec.save_processors(out, tokenizer)
    marker = {"preset": name, "build_version": BUILD_VERSION, "seed": SEED, **asdict(spec)}
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return out
