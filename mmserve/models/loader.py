"""Safetensors loading with HF name mapping and a clear error on any mismatch."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def load_safetensors(
    model: nn.Module,
    checkpoint_dir: Path,
    rename_rules: list[tuple[str, str]],
    tied: dict[str, str] | None = None,
) -> None:
    """Load every ``*.safetensors`` file of ``checkpoint_dir`` into ``model``.

    ``rename_rules`` are (regex, replacement) pairs applied in order to each checkpoint key.
    ``tied`` maps a parameter to the one it copies when the checkpoint omits it
    (e.g. ``lm_head.weight`` -> ``language_model.embed_tokens.weight``).
    Raises ValueError naming missing and unexpected keys.
    """
    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {checkpoint_dir}")
    params = dict(model.state_dict())
    persistent = {k for k in params if not _is_non_persistent(model, k)}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                name = key
                for pattern, repl in rename_rules:
                    name = re.sub(pattern, repl, name)
                if name not in params:
                    unexpected.append(key)
                    continue
                tensor = f.get_tensor(key)
                if tensor.shape != params[name].shape:
                    raise ValueError(
                        f"weight {key!r} has shape {tuple(tensor.shape)}, model expects"
                        f" {tuple(params[name].shape)} for {name!r}"
                    )
                with torch.no_grad():
                    params[name].copy_(tensor)
                loaded.add(name)
    for target, source in (tied or {}).items():
        if target not in loaded and source in loaded:
            with torch.no_grad():
                params[target].copy_(params[source])
            loaded.add(target)
    missing = sorted(persistent - loaded)
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
