"""What one real-size shape preset is: the published config and files of a hub checkpoint.

A ``ShapeSpec`` holds facts about a published checkpoint (its ``config.json``, generation
config, special-token ids, processor settings, shard size and parameter count) and how its
files name the weights. The weights themselves are random (``weights.py``); the builder
(``build.py``) writes them in the hub's layout: ``model-0000k-of-0000n.safetensors`` shards of
at most ``max_shard_bytes`` plus ``model.safetensors.index.json`` (a single
``model.safetensors`` when everything fits one shard, as the hub does).

Invariants: ``config`` is what ``config.json`` holds on the hub (the builder writes it as is,
plus the build marker's fields elsewhere); ``hub_names`` turns every parameter name of the
transformers model into the name the published safetensors use, and transformers (its
checkpoint conversion mapping) and mmserve (its rename rules) both read those names back.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

GB = 1000**3  # the hub's shard sizes are decimal ("5GB")


@dataclass(frozen=True)
class TokenLayout:
    """The published tokenizer's length and where its special tokens sit.

    ``specials`` maps each special token to its published id; every other id below ``size``
    is a trained byte-level BPE token or a never-produced filler. ``bos`` is prepended by
    ``tokenizer(text)`` when set (LLaMA and Gemma tokenizers do, Qwen's do not).
    """

    size: int
    specials: dict[str, int]
    eos: str
    pad: str
    bos: str | None = None
    unk: str | None = None
    extra_special_tokens: dict[str, str] = field(default_factory=dict)
    model_max_length: int = 32768


@dataclass(frozen=True)
class ShapeSpec:
    """One real-size checkpoint shape; ``name`` is ``shape:<hub repository name>``."""

    hub_repo: str  # e.g. "Qwen/Qwen2-VL-2B-Instruct"
    config: dict[str, Any]  # config.json as published
    model_class: str  # the transformers class that builds it
    published_params: int  # the hub's safetensors parameter count
    max_shard_bytes: int  # the hub's shard size limit
    hub_names: tuple[tuple[str, str], ...]  # (regex, replacement): transformers -> hub names
    tokens: TokenLayout
    generation_config: dict[str, Any]
    # writes the tokenizer-adjacent files (processor configs, chat template) beside it
    write_processors: Callable[[Path, PreTrainedTokenizerFast], None]

    @property
    def name(self) -> str:
        return "shape:" + self.hub_repo.split("/")[-1]

    @property
    def dtype(self) -> str:
        """The published weights' dtype (``torch_dtype`` of ``config.json``)."""
        return str(self.config.get("torch_dtype", "bfloat16"))

    def hub_name(self, name: str) -> str:
        """The published checkpoint's name of transformers parameter ``name``."""
        for pattern, repl in self.hub_names:
            name, count = re.subn(pattern, repl, name)
            if count:
                return name
        return name

    def resized(self, changes: dict[str, Any], **fields: Any) -> ShapeSpec:
        """A copy with ``changes`` merged into the config (nested dicts merge key by key) and
        ``fields`` replaced, e.g. fewer layers and a smaller shard limit for a quick build."""
        config = copy.deepcopy(self.config)
        _merge(config, changes)
        return dataclasses.replace(self, config=config, **fields)


def _merge(into: dict[str, Any], changes: dict[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
