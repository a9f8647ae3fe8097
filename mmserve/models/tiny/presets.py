"""Tiny random-weight checkpoints ("presets") built locally in the Hugging Face layout.

``build_preset(name, out_dir)`` writes a preset's ``config.json``, ``generation_config.json``,
``model.safetensors`` (float32), tokenizer, chat template and processor files, all loadable
with ``transformers``' ``from_pretrained(out_dir)``, plus the ``mmserve_preset.json`` marker.
Each family's spec (``llava.py``, ``qwen2_vl.py``, ...) says what is its own: the HF config,
generation ids, tokenizer flavour and processor files; the weight drawing, tokenizer training
and build steps here are shared. Builds are deterministic: the same name always gives
byte-identical files.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.utils import logging as hf_logging

from .build_steps import write_json
from .families.gemma3 import GEMMA3_PRESETS, Gemma3PresetSpec
from .families.idefics3 import IDEFICS3_PRESETS, Idefics3PresetSpec
from .families.llava import LLAVA_PRESETS, PresetSpec
from .families.llava_next import LLAVA_NEXT_PRESETS, LlavaNextPresetSpec
from .families.llava_onevision import ONEVISION_PRESETS, OnevisionPresetSpec
from .families.qwen2_5_vl import QWEN2_5_VL_PRESETS
from .families.qwen2_vl import QWEN2_VL_PRESETS, Qwen2VLPresetSpec
from .families.qwen3_vl import QWEN3_VL_PRESETS
from .tokenizer import build_tokenizer

BUILD_VERSION = 3  # bump whenever the bytes a build writes change (invalidates caches)
SEED = 20240601
WEIGHT_STD = 0.2  # HF's default 0.02 makes a tiny LLaVA greedily repeat a single token
BIAS_STD = 0.02
MARKER_FILE = "mmserve_preset.json"

AnySpec = (
    PresetSpec
    | Qwen2VLPresetSpec
    | OnevisionPresetSpec
    | LlavaNextPresetSpec
    | Gemma3PresetSpec
    | Idefics3PresetSpec
)

PRESETS: dict[str, AnySpec] = {
    **LLAVA_PRESETS,
    **QWEN2_VL_PRESETS,
    **QWEN2_5_VL_PRESETS,
    **QWEN3_VL_PRESETS,
    **ONEVISION_PRESETS,
    **LLAVA_NEXT_PRESETS,
    **GEMMA3_PRESETS,
    **IDEFICS3_PRESETS,
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
    write_json(out / MARKER_FILE, marker)
    return out
