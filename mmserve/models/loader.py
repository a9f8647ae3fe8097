"""Safetensors loading with HF name mapping and a clear error on any mismatch."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from mmserve.layers.fused_linear import stacked_checkpoint_rows


def load_safetensors(
    model: nn.Module,
    checkpoint_dir: Path,
    rename_rules: list[tuple[str, str]],
    tied: dict[str, str] | None = None,
    skip: Collection[str] = (),
) -> None:
    """Load every ``*.safetensors`` file of ``checkpoint_dir`` into ``model``.

    ``rename_rules`` are (regex, replacement) pairs applied in order to each checkpoint key.
    ``tied`` maps a parameter to the one it copies when the checkpoint omits it
    (e.g. ``lm_head.weight`` -> ``language_model.embed_tokens.weight``).
    ``skip`` names (after renaming) weights the checkpoint may hold that the model deliberately
    does not build, e.g. vision layers after the feature layer: they are not read. Any other key
    the model lacks is unexpected.
    Each ``StackedLinear`` shard (e.g. ``q_proj`` of a ``qkv_proj``) loads from its own
    checkpoint name into its rows and is required like a parameter of its own.
    Raises ValueError naming missing and unexpected keys.
    """
    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {checkpoint_dir}")
    params = dict(model.state_dict())
    stacked = stacked_checkpoint_rows(model)
    fused = {target for target, _ in stacked.values()}
    required = {k for k in params if k not in fused and not _is_non_persistent(model, k)}
    required |= set(stacked)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                name = key
                for pattern, repl in rename_rules:
                    name = re.sub(pattern, repl, name)
                if name in stacked:
                    target, rows = stacked[name]
                    dest = params[target][rows]
                elif name in params:
                    target, dest = name, params[name]
                else:
                    if name not in skip:
                        unexpected.append(key)
                    continue
                tensor = f.get_tensor(key)
                if tensor.shape != dest.shape:
                    raise ValueError(
                        f"weight {key!r} has shape {tuple(tensor.shape)}, model expects"
                        f" {tuple(dest.shape)} for {target!r}"
                    )
                with torch.no_grad():
                    dest.copy_(tensor)
                loaded.add(name)
    for target, source in (tied or {}).items():
        if target not in loaded and source in loaded:
            with torch.no_grad():
                params[target].copy_(params[source])
            loaded.add(target)
    missing = sorted(required - loaded)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint_dir} does not match the model:"
            f" missing keys {missing[:20]}{'...' if len(missing) > 20 else ''},"
            f" unexpected keys {unexpected[:20]}{'...' if len(unexpected) > 20 else ''}"
        )


def _is_non_persistent(model: nn.Module, name: str) -> bool:
    module_name, _, buf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    return buf in getattr(module, "_non_persistent_buffers_set", set())
