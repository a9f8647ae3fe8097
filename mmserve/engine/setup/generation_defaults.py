"""Sampling defaults from a checkpoint's ``generation_config.json`` (``--generation-config``).

``auto`` (default) reads the checkpoint's file, ``vllm`` ignores it (neutral defaults), any other
value is a directory holding a ``generation_config.json``. Like vLLM, only ``temperature``,
``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens`` (as
``max_tokens``) are taken, each only when set, and ``do_sample`` is not read. A default applies
only where the request leaves the field unset; ``max_tokens`` also caps the default length
(the room left in the context). Values no request could take (of another type or range) fail
the load, naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from mmserve.sampling_params import SamplingParams

GENERATION_CONFIG_MODES = ("auto", "vllm")
_FIELDS = {  # generation_config.json key -> SamplingParams field
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def check_generation_config(setting: str) -> None:
    """ValueError unless ``--generation-config`` is 'auto', 'vllm' or a directory containing a
    generation_config.json (run at start-up, and by ``mmserve`` before it loads anything)."""
    if setting in ("auto", "vllm"):
        return
    if not (Path(setting).expanduser() / "generation_config.json").is_file():
        raise ValueError(
            f"--generation-config {setting!r}: expected 'auto', 'vllm' or a directory"
            " containing generation_config.json"
        )


def load_generation_defaults(setting: str, model_dir: Path) -> dict[str, Any]:
    """Field -> default value for ``--generation-config setting`` (``{}`` for ``vllm``)."""
    check_generation_config(setting)
    if setting == "vllm":
        return {}
    folder = model_dir if setting == "auto" else Path(setting).expanduser()
    path = folder / "generation_config.json"
    if not path.is_file():  # only for auto: a checkpoint may have none
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    defaults = {field: data[key] for key, field in _FIELDS.items() if data.get(key) is not None}
    try:  # now, not in every request that leaves the field unset
        build_sampling_params(defaults)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return defaults


def merge_defaults(requested: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``requested`` with its unset (None) fields taken from ``defaults``; fields unset in
    both are left out (the SamplingParams default applies)."""
    merged = {k: v for k, v in defaults.items() if k != "max_tokens"}
    merged.update({k: v for k, v in requested.items() if v is not None})
    return merged


def build_sampling_params(values: Mapping[str, Any]) -> SamplingParams:
    """``SamplingParams(**values)`` without the fields this SamplingParams lacks (a default
    such as ``min_p`` stays in the generation defaults until sampling implements it)."""
    known = {f.name for f in fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in values.items() if k in known})


def default_max_tokens(max_model_len: int, num_prompt_tokens: int, cap: int | None) -> int:
    """The room left in the context, capped by the generation config's ``max_new_tokens``."""
    room = max(1, max_model_len - num_prompt_tokens)
    return room if cap is None else max(1, min(room, cap))


def describe_defaults(defaults: Mapping[str, Any], source: str) -> str:
    """One log line naming the defaults and how to turn them off."""
    if not defaults:
        return f"sampling defaults: none from the generation config ({source})"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(defaults.items()))
    return (
        f"sampling defaults from the generation config ({source}): {shown}; they apply where a"
        " request leaves the field unset (--generation-config vllm ignores them)"
    )
