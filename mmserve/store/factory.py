"""Build an ``EncoderStore`` from its config: fingerprint, secret, tiers."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from mmserve.config import EncoderStoreConfig
from mmserve.store.codec import StoreCodec
from mmserve.store.disk import DiskTier
from mmserve.store.fingerprint import weights_fingerprint
from mmserve.store.keys import StoreKeyer
from mmserve.store.ram import RamTier
from mmserve.store.redis_tier import RedisTier
from mmserve.store.store import ByteTier, EncoderStore

logger = logging.getLogger(__name__)

SECRET_FILE = ".mmserve-store-secret"


def resolve_secret(config: EncoderStoreConfig) -> bytes:
    """The given secret (setting or environment); else for a disk-only store a random secret
    kept (0600) in its directory; else random per process (L1 alone never serializes).
    Runs ``config.check_usable`` first, the checks `mmserve` ran before loading (ValueError:
    e.g. a Redis tier without a given secret)."""
    config.check_usable()
    secret = config.given_secret()
    if secret is not None:
        return secret
    if config.disk_dir is None:
        return os.urandom(32)
    path = Path(config.disk_dir) / SECRET_FILE
    Path(config.disk_dir).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _written_secret(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(32).hex().encode())
    return path.read_bytes()


def _written_secret(path: Path, attempts: int = 50) -> bytes:
    """The secret another process created: it may not have written it yet (create, then
    write), so an empty read is retried briefly."""
    for _ in range(attempts):
        secret = path.read_bytes()
        if secret:
            return secret
        time.sleep(0.02)
    raise ValueError(f"encoder store secret file {path} stays empty")


def open_encoder_store(
    config: EncoderStoreConfig, model_path: Path, dtype: str, torch_dtype: torch.dtype
) -> EncoderStore:
    secret = resolve_secret(config)  # first: its checks are what `mmserve` ran before loading
    fingerprint = weights_fingerprint(model_path)
    tiers: list[ByteTier] = []
    if config.disk_dir is not None:
        tiers.append(DiskTier(config.disk_dir, config.disk_bytes))
    if config.redis_url is not None:
        tiers.append(_redis_tier(config.redis_url, config))
    store = EncoderStore(
        StoreKeyer(fingerprint, dtype),
        StoreCodec(secret, torch_dtype),
        RamTier(config.ram_bytes) if config.ram_bytes else None,
        tiers,
        config.write_queue,
        lease_ms=config.lease_ms,
    )
    logger.info(
        "encoder store: L1 %d bytes, L2 %s, L3 %s, weights fingerprint %s",
        config.ram_bytes,
        config.disk_dir or "off",
        "on" if config.redis_url else "off",
        fingerprint[:16],
    )
    return store


def open_shared_store(
    config: EncoderStoreConfig, fingerprint: str, dtype: str, torch_dtype: torch.dtype
) -> EncoderStore | None:
    """The Redis tier alone (no L1, L2 or lease), keyed with ``fingerprint`` as the engines
    computed it: what a process without the weights (the Ray ingress) needs to read the records
    the engines share. None without Redis."""
    if config.redis_url is None:
        return None
    secret = resolve_secret(config)
    keyer, codec = StoreKeyer(fingerprint, dtype), StoreCodec(secret, torch_dtype)
    tier = _redis_tier(config.redis_url, config)
    return EncoderStore(keyer, codec, None, [tier], config.write_queue)


def _redis_tier(url: str, config: EncoderStoreConfig) -> RedisTier:
    return RedisTier(url, config.ttl_s, max(0.2, 4 * config.timeout_ms / 1000))
