"""L3: Redis, shared by every replica (the ``redis`` client with the ``hiredis`` parser)."""

from __future__ import annotations

import threading
import time
from typing import Any

from mmserve.config import check_redis_url
from mmserve.extras import require_extra

KEY_PREFIX = "mmserve:enc:"


class TierUnavailable(Exception):
    """The tier is skipped: its circuit is open after a recent failure."""


class RedisTier:
    """Values are written once (``SET NX`` with a TTL) and read with ``GETEX`` (refreshing
    the TTL, so entries in use do not expire).

    Invariants: every call has a socket timeout; a failed call opens the circuit for
    ``cooldown`` seconds, during which calls raise ``TierUnavailable`` at once, so a dead or
    hanging Redis costs one timeout per cooldown, not one per lookup; calls raise, the store
    counts (never the user's request).
    """

    name = "redis"

    def __init__(self, url: str, ttl_s: int, timeout_s: float, cooldown_s: float = 5.0) -> None:
        # the optional ``redis`` client (the ``store`` extra): imported only when used
        redis = require_extra("redis", "store", "encoder_store_redis (--encoder-store-redis)")
        check_redis_url(url)
        if ttl_s < 1:
            raise ValueError(f"encoder_store_ttl must be >= 1 second, got {ttl_s}")
        self.url = url
        self.ttl_s = ttl_s
        self.cooldown_s = cooldown_s
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._open_until = 0.0
        self._lock = threading.Lock()

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a method of ``client``) behind the circuit."""
        if time.monotonic() < self._open_until:
            raise TierUnavailable("redis circuit open")
        try:
            return fn(*args, **kwargs)
        except Exception:
            with self._lock:
                self._open_until = time.monotonic() + self.cooldown_s
            raise

    def get(self, key: str) -> bytes | None:
        value = self.call(self.client.getex, KEY_PREFIX + key, ex=self.ttl_s)
        return None if value is None else bytes(value)

    def put(self, key: str, value: bytes) -> bool:
        """Whether this call stored it (False: the key existed, its TTL left as it was)."""
        return bool(self.call(self.client.set, KEY_PREFIX + key, value, nx=True, ex=self.ttl_s))

    def delete(self, key: str) -> None:
        self.call(self.client.delete, KEY_PREFIX + key)

    def close(self) -> None:
        self.client.close()
