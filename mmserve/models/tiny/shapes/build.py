"""The shape registry and builder: ``build_shape(name, out_dir)`` writes one real-size
checkpoint with random weights in its hub layout.

Files: ``config.json`` and ``generation_config.json`` as published, the safetensors weights in
the published dtype, shards and names (``weights.py``, ``spec.py``), the tokenizer
(``tokens.py``), the processor files and chat template the family writes, and the
``mmserve_preset.json`` marker. Builds are deterministic (same name and
``SHAPE_BUILD_VERSION``, same bytes) and stream the weights: memory stays ~100 MB for any size,
time is what the disk takes (~4.4 GB for Qwen2-VL-2B, ~14 GB for LLaVA-1.5-7B).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoConfig

from ..build_steps import write_json
from .gemma import GEMMA_3_4B
from .llava import LLAVA_1_5_7B, LLAVA_ONEVISION_0_5B
from .qwen import QWEN2_5_VL_3B, QWEN2_VL_2B
from .smolvlm import SMOLVLM_256M, SMOLVLM_500M
from .spec import ShapeSpec
from .tokens import build_shape_tokenizer
from .weights import SEED, TensorPlan, write_checkpoint

SHAPE_BUILD_VERSION = 2  # bump whenever the bytes a build writes change (invalidates caches)
MARKER_FILE = "mmserve_preset.json"
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

SHAPES: dict[str, ShapeSpec] = {
    spec.name: spec
    for spec in (
        SMOLVLM_256M,
        SMOLVLM_500M,
        LLAVA_ONEVISION_0_5B,
        QWEN2_VL_2B,
        QWEN2_5_VL_3B,
        GEMMA_3_4B,
        LLAVA_1_5_7B,
    )
}
SHAPE_NAMES: tuple[str, ...] = tuple(SHAPES)


def get_shape(name: str) -> ShapeSpec:
    """The spec of shape ``name``, or ``ValueError`` listing the valid names."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(
            f"unknown shape {name!r}; valid shapes: {', '.join(SHAPE_NAMES)}"
        ) from None


def shape_config(spec: ShapeSpec) -> Any:
    """The HF config transformers reads from the published ``config.json``."""
    return AutoConfig.for_model(**spec.config)


def meta_model(spec: ShapeSpec) -> nn.Module:
    """The transformers model of ``spec`` on the meta device (no memory)."""
    with torch.device("meta"):
        return getattr(transformers, spec.model_class)(shape_config(spec))


def count_shape_parameters(name: str) -> int:
    """Parameters of shape ``name`` (tied ones once), counted on the meta device."""
    return sum(p.numel() for p in meta_model(get_shape(name)).parameters())


def tensor_plans(spec: ShapeSpec, model: nn.Module | None = None) -> list[TensorPlan]:
    """Every stored tensor in model order under its published name (tied ones once)."""
    model = model if model is not None else meta_model(spec)
    norms: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm"):
            norms.update(id(p) for p in module.parameters(recurse=False))
    dtype = TORCH_DTYPES[spec.dtype]
    plans = []
    for name, param in model.named_parameters():
        if param.ndim >= 2:
            fill = "normal"
        elif id(param) in norms and name.endswith("weight"):
            fill = "ones"
        else:
            fill = "small"
        plans.append(TensorPlan(spec.hub_name(name), tuple(param.shape), dtype, fill))
    return plans


def build_shape(name: str, out_dir: str | Path) -> Path:
    """Write the complete checkpoint of shape ``name`` into ``out_dir`` and return it."""
    return build_spec(get_shape(name), out_dir)


def build_spec(spec: ShapeSpec, out_dir: str | Path) -> Path:
    """``build_shape`` of any spec, e.g. a ``ShapeSpec.resized`` copy of a registered one."""
    name = spec.name
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", spec.config)
    write_json(out / "generation_config.json", spec.generation_config)
    spec.write_processors(out, build_shape_tokenizer(spec.tokens))
    write_checkpoint(out, tensor_plans(spec), spec.max_shard_bytes)
    marker = {"shape": name, "hub_repo": spec.hub_repo, "build_version": SHAPE_BUILD_VERSION,
              "seed": SEED}  # fmt: skip
    write_json(out / MARKER_FILE, marker)
    return out
