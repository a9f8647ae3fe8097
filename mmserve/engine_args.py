"""``EngineArgs``: every engine setting declared once (name, type, default, help); the model's
own come first, from its base ``model_args.ModelArgs``.

``LLM(**kwargs)`` / ``LLMEngine.from_args`` take these names as keyword arguments, the ``serve``
and ``generate`` commands get one flag per field from ``add_cli_args`` (vLLM's pattern), and
``engine.loading.create_engine_config`` turns them into the frozen configs (whose range checks
already run when an ``EngineArgs`` is made; ``validate`` adds the encoder store's). Torch-free,
so building the CLI parser and checking the flags stay fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from mmserve.arg_fields import add_field_flags, arg_field
from mmserve.arg_types import human_readable_int, parse_bytes, parse_json_object, parse_mm_limits
from mmserve.config import CacheConfig, EncoderStoreConfig, GiB, SchedulerConfig
from mmserve.model_args import ModelArgs

__all__ = ["EngineArgs", "parse_bytes", "parse_json_object", "parse_mm_limits"]

HASH_ALGOS = ("xxh3_128", "sha256")
KWARG_ALIASES = {  # vLLM's LLM(...) names
    "kv_cache_memory_bytes": "kv_cache_memory",
    "mm_processor_kwargs": "processor_kwargs",
}


@dataclass
class EngineArgs(ModelArgs):
    """Engine settings. Unset (None) fields are autotuned from the model and the others."""

    block_size: int = arg_field(16, "tokens per KV cache block")
    num_kv_blocks: int | None = arg_field(
        None, "KV cache blocks (default: max_num_seqs full-length sequences, capped by"
        " kv_cache_memory)",
    )  # fmt: skip
    kv_cache_memory: int = arg_field(
        1 * GiB, "KV cache memory cap, e.g. 512MiB, 4G (K/M/G are powers of 1024)",
        type=parse_bytes, aliases=("--kv-cache-memory-bytes",),
    )  # fmt: skip
    gpu_memory_utilization: float | None = arg_field(
        None, "CUDA: the fraction of the GPU's memory mmserve may use (weights, peak activations"
        " from a profiling pass, encoder cache; the rest is KV cache), 0.9 when unset; ignored"
        " on CPU, where --kv-cache-memory-bytes / --num-kv-blocks size the KV cache",
    )  # fmt: skip
    enable_prefix_caching: bool = arg_field(
        True, "reuse KV blocks of shared prefixes, images included"
    )
    prefix_caching_hash_algo: str = arg_field("xxh3_128", "block hash", choices=HASH_ALGOS)
    prefix_caching_seed: int | None = arg_field(
        None, "root hash seed (default: random per process)"
    )
    enable_encoder_cache: bool = arg_field(True, "keep encoder outputs for reuse across requests")
    encoder_cache_memory: int = arg_field(
        1 * GiB, "encoder cache memory when encoder_cache_size is unset", type=parse_bytes
    )
    encoder_cache_size: int | None = arg_field(None, "encoder cache capacity in embeddings")
    max_num_encoder_input_tokens: int | None = arg_field(
        None, "encoder compute budget per step in embeddings"
    )
    max_num_batched_tokens: int = arg_field(
        2048, "token budget per step, e.g. 2048, 8k, 8K", type=human_readable_int
    )
    max_num_seqs: int = arg_field(64, "max requests in the running batch")
    disable_chunked_mm_input: bool = arg_field(False, "never split an image's tokens across chunks")
    limit_mm_per_prompt: dict[str, int] = arg_field(
        {"image": 16}, "max items per prompt as JSON, e.g. '{\"image\": 2, \"video\": 1}'"
        " (video: 1 unless given; audio: 0 only)", type=parse_mm_limits,
    )  # fmt: skip
    stall_steps: int | None = arg_field(None, "steps without progress before a request fails")
    encoder_store_dir: str | None = arg_field(
        None, "encoder store L2: a local directory keeping encoder outputs across restarts"
    )
    encoder_store_redis: str | None = arg_field(
        None, "encoder store L3: redis://host:port/db shared by replicas (needs a secret)",
        metavar="URL",
    )  # fmt: skip
    encoder_store_secret: str | None = arg_field(
        None, "encoder store MAC secret, the same on every replica sharing L3 (default:"
        " $MMSERVE_ENCODER_STORE_SECRET; for L2 alone a random one kept in the directory)",
        secret=True,
    )  # fmt: skip
    encoder_store_ram: int | None = arg_field(
        None, "encoder store L1 host RAM for evicted encoder outputs, e.g. 2GiB (default: 1 GiB"
        " when a disk or Redis tier is set, else off; 0: off)", type=parse_bytes,
    )  # fmt: skip
    encoder_store_disk_bytes: int = arg_field(
        16 * GiB, "encoder store L2 byte cap (least recently used files go first)",
        type=parse_bytes,
    )  # fmt: skip
    encoder_store_ttl: int = arg_field(
        86400, "encoder store L3 entry lifetime in seconds (refreshed on read)"
    )
    encoder_store_timeout_ms: float = arg_field(
        50.0, "how long admission waits for a request's store lookups before encoding instead"
    )
    encoder_store_write_queue: int = arg_field(
        64, "encoder store write-behind queue length (full: writes are dropped and counted)"
    )
    encoder_store_lease_ms: int = arg_field(
        2000, "with L3: lifetime of the encode lease of the replica that misses a new image"
        " first (renewed while it encodes; how long a dead holder keeps the others waiting;"
        " 0: each replica encodes)",
    )  # fmt: skip
    tensor_parallel_size: int = arg_field(
        1, "vLLM compatibility: mmserve runs a model on one device, so only 1 is accepted",
        aliases=("-tp",),
    )  # fmt: skip
    trust_remote_code: bool = arg_field(
        False, "vLLM compatibility: accepted and ignored; mmserve never runs code from a checkpoint"
    )
    enforce_eager: bool | None = arg_field(
        None, "no CUDA graphs: decode runs eagerly (vLLM's). Unset: decode steps replay CUDA"
        " graphs on CUDA and run eagerly on CPU; --no-enforce-eager on CPU runs decode through"
        " the graphs' padded static-shape path without capture (tests, the GPU dry run)",
    )  # fmt: skip
    cuda_graph_sizes: list[int] | None = arg_field(
        None, "decode batch sizes with a CUDA graph (vLLM's): one value N gives 1, 2, 4 and"
        " the multiples of 8 up to N, several values are the sizes (default: that pattern up"
        " to max_num_seqs); larger batches run eagerly", type=int, nargs="+",
    )  # fmt: skip
    max_seq_len_to_capture: int = arg_field(
        8192, "the longest context CUDA graphs cover (vLLM's): a decode step with a longer"
        " sequence runs eagerly", type=human_readable_int,
    )  # fmt: skip

    def __post_init__(self) -> None:
        """Normalise vLLM's aliases and refuse what mmserve cannot honour, before anything
        loads (ValueError naming the setting)."""
        super().__post_init__()  # dtype and device (ModelArgs)
        if self.tensor_parallel_size != 1:
            raise ValueError(
                f"tensor_parallel_size (--tensor-parallel-size) must be 1: mmserve runs a model"
                f" on one device, got {self.tensor_parallel_size}"
            )
        fraction = self.gpu_memory_utilization
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {fraction}")
        for modality, count in self.limit_mm_per_prompt.items():
            if modality not in ("image", "video") and count > 0:
                raise ValueError(
                    f"limit_mm_per_prompt (--limit-mm-per-prompt): mmserve serves image and video"
                    f" input only, got {modality}={count}; set it to 0 or leave it out"
                )
        if self.cuda_graph_sizes is not None and (
            not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1
        ):
            raise ValueError(f"cuda_graph_sizes must be positive, got {self.cuda_graph_sizes}")
        if self.max_seq_len_to_capture < 1:
            raise ValueError(
                f"max_seq_len_to_capture must be >= 1, got {self.max_seq_len_to_capture}"
            )
        # the frozen configs' own range checks, now rather than once a checkpoint is read
        self.cache_config()
        self.scheduler_config()
        self.encoder_store_config()

    def validate(self) -> None:
        """Beyond the values (checked at construction): what the encoder store checks when it
        opens (a given secret, required with Redis; the ``redis`` client, ``MissingExtra``
        naming the extra; a usable directory), without connecting or creating anything.
        ``mmserve`` runs it before it loads or deploys; checks that need the checkpoint
        (``max_model_len``) or torch (``--device cuda``) stay with ``create_engine_config``."""
        store = self.encoder_store_config()
        if store is not None:
            store.check_usable()

    def ignored_settings(self) -> list[str]:
        """A line for each vLLM setting that was given but has no effect here (logged)."""
        notes = []
        if self.trust_remote_code:
            notes.append("--trust-remote-code is ignored: mmserve runs no code from checkpoints")
        if self.gpu_memory_utilization is not None and self.device == "cpu":
            notes.append(
                f"--gpu-memory-utilization {self.gpu_memory_utilization} is ignored on CPU: the"
                f" KV cache is sized by --kv-cache-memory-bytes ({self.kv_cache_memory} bytes)"
                " or --num-kv-blocks"
            )
        return notes

    @classmethod
    def add_cli_args(
        cls,
        parser: argparse.ArgumentParser | Any,
        defaults: dict[str, Any] | None = None,
        exclude: tuple[str, ...] = (),
    ) -> None:
        """One ``--flag`` per field (``--no-flag`` for booleans), defaults from the fields
        (``defaults`` overrides some, e.g. a benchmark's model; ``exclude`` leaves some out)."""
        add_field_flags(cls, parser, defaults, exclude)

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
        kwargs = {KWARG_ALIASES.get(k, k): v for k, v in kwargs.items()}
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

    def encoder_store_config(self) -> EncoderStoreConfig | None:
        """None when no tier is set: the engine runs without a store (today's path)."""
        ram = self.encoder_store_ram
        if ram is None:
            ram = 1 * GiB if (self.encoder_store_dir or self.encoder_store_redis) else 0
        config = EncoderStoreConfig(
            ram_bytes=ram,
            disk_dir=self.encoder_store_dir,
            disk_bytes=self.encoder_store_disk_bytes,
            redis_url=self.encoder_store_redis,
            secret=self.encoder_store_secret,
            ttl_s=self.encoder_store_ttl,
            timeout_ms=self.encoder_store_timeout_ms,
            write_queue=self.encoder_store_write_queue,
            lease_ms=self.encoder_store_lease_ms,
        )
        return config if config.enabled else None

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            disable_chunked_mm_input=self.disable_chunked_mm_input,
            encoder_cache_size=self.encoder_cache_size,
            max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
            # other modalities are all 0 here (checked in __post_init__)
            limit_mm_per_prompt={
                k: v for k, v in self.limit_mm_per_prompt.items() if k in ("image", "video")
            },
            stall_steps=self.stall_steps,
        )
