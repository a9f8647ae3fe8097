"""Engine configuration: frozen dataclasses, validated once at construction.

The settings and their defaults are declared once, in ``mmserve.engine_args.EngineArgs``; these
classes only hold and validate them."""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mmserve.extras import require_extra
from mmserve.graph_config import DecodeGraphConfig

GiB = 1 << 30
DEFAULT_IMAGE_LIMIT = 16
DEFAULT_VIDEO_LIMIT = 1  # videos per prompt when limit_mm_per_prompt names none
_DTYPES = ("float32", "float16", "bfloat16")


ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "cpu-kernel", "torch", "flex")
REDIS_SCHEMES = ("redis", "rediss", "unix")
SECRET_ENV = "MMSERVE_ENCODER_STORE_SECRET"  # the store's MAC secret when the setting is unset
MIN_SECRET_BYTES = 16


DEVICE_SYNTAX = re.compile(r"auto|cpu|cuda(:\d+)?")  # --device


def check_device_syntax(requested: str) -> None:
    """ValueError unless ``requested`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if not DEVICE_SYNTAX.fullmatch(requested):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {requested!r}")


def checkpoint_dtype(hf_config: Any) -> str | None:
    """The dtype a HF config declares (``dtype`` / ``torch_dtype``, top level or text config)."""
    for cfg in (hf_config, getattr(hf_config, "text_config", None)):
        for attr in ("dtype", "torch_dtype"):
            value = getattr(cfg, attr, None) if cfg is not None else None
            if value is not None:
                return str(value).removeprefix("torch.")
    return None


def resolve_dtype(
    requested: str, declared: str | None, device: str, cpu_native: Collection[str] = ()
) -> str:
    """``auto``: on CPU the checkpoint's dtype when it is a half one (float16 / bfloat16) that
    the CPU runs natively (``cpu_native``: the half dtypes it does, see
    ``mmserve.kernels.cpu_features``), else float32; on CUDA the checkpoint's half dtype, else
    bfloat16. Any other value is returned as it is."""
    if requested != "auto":
        return requested
    half = declared if declared in ("float16", "bfloat16") else None
    if device.split(":")[0] == "cpu":
        return half if half is not None and half in cpu_native else "float32"
    return half or "bfloat16"


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know about a checkpoint, derived from its HF config."""

    model: str
    path: Path
    architecture: str
    hf_config: Any
    dtype: str = "float32"
    max_model_len: int = 2048
    hidden_size: int = 0
    embedding_width: int = 0  # columns of one encoder-output row (0: hidden_size)
    image_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    max_tokens_per_image: int = 0  # largest embedding count one image can produce
    max_tokens_per_video_group: int = 0  # same for one video frame group; 0: no video input
    processor_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None  # resolved text (None: the checkpoint has none)
    chat_template_source: str = "none"  # where it came from, for the start-up log
    generation_defaults: dict[str, Any] = field(default_factory=dict)  # field -> default

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def bytes_per_embedding(self) -> int:
        """Bytes of one encoder-cache row (DeepStack models keep wider rows)."""
        return (self.embedding_width or self.hidden_size) * self.dtype_bytes


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    num_kv_blocks: int | None  # None: enough for max_num_seqs full-length sequences
    kv_cache_memory: int  # upper bound when num_kv_blocks is None
    enable_prefix_caching: bool
    prefix_caching_hash_algo: str
    prefix_caching_seed: int | None  # None: a random root hash per process
    encoder_cache_memory: int
    enable_encoder_cache: bool  # False: drop embeddings once no request needs them

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory must be >= 1, got {self.kv_cache_memory}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.encoder_cache_memory < 0:
            raise ValueError(f"encoder_cache_memory must be >= 0, got {self.encoder_cache_memory}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int
    max_num_seqs: int
    disable_chunked_mm_input: bool
    encoder_cache_size: int | None  # embeddings; None: autotuned
    max_num_encoder_input_tokens: int | None  # embeddings per step; None: autotuned
    limit_mm_per_prompt: dict[str, int]
    stall_steps: int | None  # steps without progress before failing a request; None: auto

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.stall_steps is not None and self.stall_steps < 1:
            raise ValueError(f"stall_steps must be >= 1, got {self.stall_steps}")
        unknown = set(self.limit_mm_per_prompt) - {"image", "video"}
        if unknown:
            raise ValueError(
                f"limit_mm_per_prompt supports only 'image' and 'video', got {sorted(unknown)}"
            )
        if any(count < 0 for count in self.limit_mm_per_prompt.values()):
            raise ValueError(f"limit_mm_per_prompt must be >= 0, got {self.limit_mm_per_prompt}")

    @property
    def max_images_per_prompt(self) -> int:
        return self.limit_mm_per_prompt.get("image", DEFAULT_IMAGE_LIMIT)

    @property
    def max_videos_per_prompt(self) -> int:
        return self.limit_mm_per_prompt.get("video", DEFAULT_VIDEO_LIMIT)


@dataclass(frozen=True)
class EncoderStoreConfig:
    """The encoder store's tiers below the encoder cache (see ``mmserve.store``)."""

    ram_bytes: int  # L1 host RAM; 0: no L1
    disk_dir: str | None  # L2; None: no L2
    disk_bytes: int
    redis_url: str | None  # L3; None: no L3
    secret: str | None = field(repr=False)  # MAC secret; None: $MMSERVE_ENCODER_STORE_SECRET
    ttl_s: int = 86400
    timeout_ms: float = 50.0
    write_queue: int = 64
    lease_ms: int = 2000  # the encode lease's lifetime with L3; 0: no lease

    def __post_init__(self) -> None:
        """ValueError naming the ``encoder_store_*`` setting that is out of range."""
        checks = (
            ("encoder_store_ram", self.ram_bytes, 0),
            ("encoder_store_disk_bytes", self.disk_bytes, 1),
            ("encoder_store_ttl", self.ttl_s, 1),
            ("encoder_store_write_queue", self.write_queue, 1),
            ("encoder_store_lease_ms", self.lease_ms, 0),
        )
        for name, value, least in checks:
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not self.timeout_ms > 0:
            raise ValueError(f"encoder_store_timeout_ms must be > 0, got {self.timeout_ms!r}")
        if self.disk_dir == "":
            raise ValueError("encoder_store_dir must be a directory path, got ''")
        if self.redis_url is not None:
            check_redis_url(self.redis_url)

    @property
    def enabled(self) -> bool:
        return bool(self.ram_bytes or self.disk_dir or self.redis_url)

    def given_secret(self) -> bytes | None:
        """The MAC secret the deployment gives: the setting, else ``$MMSERVE_ENCODER_STORE_SECRET``
        (None: neither; a disk-only or RAM-only store then makes its own)."""
        secret = self.secret or os.environ.get(SECRET_ENV)
        return secret.encode() if secret else None

    def check_usable(self) -> None:
        """What opening the store needs beyond in-range values, checked without connecting or
        creating anything: a given secret of >= 16 bytes, required with L3 (replicas sharing
        Redis must share it); the ``redis`` client with L3 (``MissingExtra`` naming the
        ``store`` extra); an L2 directory that is, or can be created as, a writable directory.
        ``open_encoder_store`` runs it, and ``mmserve`` before it loads or deploys anything."""
        secret = self.given_secret()
        if secret is not None:
            check_secret(secret)
        if self.redis_url is not None:
            if secret is None:
                raise ValueError(
                    f"encoder_store_redis {self.redis_url!r} needs encoder_store_secret"
                    f" (--encoder-store-secret) or ${SECRET_ENV}: replicas sharing Redis must"
                    " share the MAC secret"
                )
            require_extra("redis", "store", "encoder_store_redis (--encoder-store-redis)")
        if self.disk_dir is not None:
            check_store_dir(self.disk_dir)


def check_redis_url(url: str) -> None:
    """ValueError unless ``url`` is a redis://, rediss:// or unix:// URL."""
    if urlsplit(url).scheme not in REDIS_SCHEMES:
        raise ValueError(
            f"encoder_store_redis must be a redis://, rediss:// or unix:// URL, got {url!r}"
        )


def check_secret(secret: bytes) -> None:
    """ValueError unless the store's MAC secret has at least ``MIN_SECRET_BYTES`` bytes."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the encoder store secret (encoder_store_secret, --encoder-store-secret or"
            f" ${SECRET_ENV}) must be >= {MIN_SECRET_BYTES} bytes, got {len(secret)}"
        )


def check_store_dir(path: str | Path) -> None:
    """ValueError unless ``path`` is a writable directory or can be made one (its nearest
    existing ancestor is a writable directory). Creates nothing."""
    existing = Path(path)
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"encoder_store_dir {str(path)!r} is not usable: {existing} is not a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"encoder_store_dir {str(path)!r} is not writable ({existing})")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    seed: int = 0
    attention_backend: str = "auto"
    device: str = "cpu"  # resolved: cpu or cuda:N
    gpu_memory_utilization: float = 0.9  # CUDA only: the fraction of device memory to use
    encoder_store: EncoderStoreConfig | None = None  # None: no store (today's path)
    decode_graphs: DecodeGraphConfig | None = None  # None: decode runs eagerly
