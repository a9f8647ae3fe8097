"""``EngineArgs``: every engine setting declared once (name, type, default, help).

``LLM(**kwargs)`` / ``LLMEngine.from_args`` take these names as keyword arguments, the ``serve``
and ``generate`` commands get one flag per field from ``add_cli_args`` (vLLM's pattern), and
``engine.loading.create_engine_config`` validates them once into the frozen configs.
Torch-free, so building the CLI parser stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from mmserve.config import ATTENTION_BACKENDS, CacheConfig, GiB, SchedulerConfig

if TYPE_CHECKING:
    pass

DTYPES = ("float32", "float16", "bfloat16")
HASH_ALGOS = ("xxh3_128", "sha256")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``1073741824``, ``512MiB``, ``1G``, ``1.5GB`` -> bytes (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 512MiB, 1GiB)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def parse_mm_limits(text: str) -> dict[str, int]:
    """``'{"image": 2}'`` -> {"image": 2}; anything else is a usage error."""
    value = parse_json_object(text)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()):
        raise argparse.ArgumentTypeError(
            f'expected a JSON object of non-negative counts like {{"image": 2}}, got {text!r}'
        )
    return value


def _arg(default: Any, help_text: str, **cli: Any) -> Any:
    """A field with its help text and CLI options (``type``, ``choices``, ``metavar``)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help_text, **cli})
    return field(default=default, metadata={"help": help_text, **cli})


@dataclass
class EngineArgs:
    """Engine settings. Unset (None) fields are autotuned from the model and the others."""

    model: str = _arg("tiny-llava", "preset name or HF checkpoint dir")
    dtype: str = _arg("float32", "weight / activation dtype", choices=DTYPES)
    seed: int = _arg(0, "engine seed (sampling without a per-request seed)")
    device: str = _arg("cpu", "torch device")
    attention_backend: str = _arg(
        "auto",
        "LM attention: 'cpu-kernel' (compiled, reads the paged KV cache in place; CPU float32),"
        " 'torch' (gather + SDPA, any device/dtype), 'auto' (the kernel where it applies)",
        choices=ATTENTION_BACKENDS,
    )
    max_model_len: int | None = _arg(None, "context length (default: from the model config)")
    processor_kwargs: dict[str, Any] | None = _arg(
        None, "HF image processor overrides as JSON, e.g. '{\"max_pixels\": 401408}'"
        " (vLLM's --mm-processor-kwargs)",
        type=parse_json_object, aliases=("--mm-processor-kwargs",),
    )  # fmt: skip
    chat_template: str | None = _arg(
        None, "chat template file or template text (default: the checkpoint's chat_template.jinja,"
        " chat_template.json, tokenizer or processor config)",
        metavar="PATH|TEMPLATE",
    )  # fmt: skip
    generation_config: str = _arg(
        "auto", "sampling defaults: 'auto' (the checkpoint's generation_config.json), 'vllm'"
        " (ignore it) or a directory holding a generation_config.json",
        metavar="auto|vllm|DIR",
    )  # fmt: skip
    block_size: int = _arg(16, "tokens per KV cache block")
    num_kv_blocks: int | None = _arg(
        None, "KV cache blocks (default: max_num_seqs full-length sequences, capped by"
        " kv_cache_memory)",
    )  # fmt: skip
    kv_cache_memory: int = _arg(1 * GiB, "KV cache memory cap, e.g. 512MiB", type=parse_bytes)
    enable_prefix_caching: bool = _arg(True, "reuse KV blocks of shared prefixes, images included")
    prefix_caching_hash_algo: str = _arg("xxh3_128", "block hash", choices=HASH_ALGOS)
    prefix_caching_seed: int | None = _arg(None, "root hash seed (default: random per process)")
    enable_encoder_cache: bool = _arg(True, "keep encoder outputs for reuse across requests")
    encoder_cache_memory: int = _arg(
        1 * GiB, "encoder cache memory when encoder_cache_size is unset", type=parse_bytes
    )
    encoder_cache_size: int | None = _arg(None, "encoder cache capacity in embeddings")
    max_num_encoder_input_tokens: int | None = _arg(
        None, "encoder compute budget per step in embeddings"
    )
    max_num_batched_tokens: int = _arg(2048, "token budget per step")
    max_num_seqs: int = _arg(64, "max requests in the running batch")
    disable_chunked_mm_input: bool = _arg(False, "never split an image's tokens across chunks")
    limit_mm_per_prompt: dict[str, int] = _arg(
        {"image": 16}, "max items per prompt as JSON, e.g. '{\"image\": 2}'", type=parse_mm_limits
    )
    stall_steps: int | None = _arg(None, "steps without progress before a request fails")

    @classmethod
    def add_cli_args(
        cls,
        parser: argparse.ArgumentParser | Any,
        defaults: dict[str, Any] | None = None,
        exclude: tuple[str, ...] = (),
    ) -> None:
        """One ``--flag`` per field (``--no-flag`` for booleans), defaults from the fields
        (``defaults`` overrides some, e.g. a benchmark's model; ``exclude`` leaves some out)."""
        for f in fields(cls):
            if f.name in exclude:
                continue
            meta = dict(f.metadata)
            flag = "--" + f.name.replace("_", "-")
            default = f.default_factory() if callable(f.default_factory) else f.default
            default = (defaults or {}).get(f.name, default)
            shown = json.dumps(default) if isinstance(default, dict) else default
            text = f"{meta.pop('help')} (default: {shown})".replace("%", "%%")
            if f.type == "bool":
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=default, help=text
                )
                continue
            kind = meta.pop("type", int if "int" in str(f.type) else str)
            aliases = meta.pop("aliases", ())
            parser.add_argument(flag, *aliases, type=kind, default=default, help=text, **meta)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The fields present in ``args`` (excluded ones keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def as_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """``LLM(**...)`` keyword arguments, with ``overrides`` applied on top."""
        return {**dataclasses.asdict(self), **overrides}

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> EngineArgs:
        """``EngineArgs(model, **kwargs)`` with a ValueError naming unknown settings."""
        known = {f.name for f in fields(cls)}
        if "mm_processor_kwargs" in kwargs:  # vLLM's name for processor_kwargs
            kwargs["processor_kwargs"] = kwargs.pop("mm_processor_kwargs")
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine argument(s) {unknown}; known: {sorted(known)}")
        if model is not None:
            kwargs["model"] = model
        return cls(**kwargs)

    def replace(self, **changes: Any) -> EngineArgs:
        return dataclasses.replace(self, **changes)

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory=self.kv_cache_memory,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
            prefix_caching_seed=self.prefix_caching_seed,
            encoder_cache_memory=self.encoder_cache_memory,
            enable_encoder_cache=self.enable_encoder_cache,
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            disable_chunked_mm_input=self.disable_chunked_mm_input,
            encoder_cache_size=self.encoder_cache_size,
            max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
            limit_mm_per_prompt=dict(self.limit_mm_per_prompt),
            stall_steps=self.stall_steps,
        )
