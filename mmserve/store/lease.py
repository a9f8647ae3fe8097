"""The encode lease: which of the replicas sharing Redis encodes an item they all missed."""

from __future__ import annotations

import itertools
import os
import threading
import time

from mmserve.store.redis_tier import RedisTier

LEASE_PREFIX = "mmserve:lease:"
MAX_HELD = 4096  # tokens remembered at once; an older one is forgotten (its lease expires)
# delete the lease only if it still carries the caller's token (a compare-and-delete)
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class EncodeLease:
    """A short lease per store key in the shared Redis: ``SET NX PX`` with a random token.

    Invariants: at most one holder per store key at a time; a lease lives at most
    ``lease_ms`` (no renewal), so a holder that dies or stalls holds nobody up for longer;
    only the token that took it releases it (compare-and-delete), so a holder whose lease ran
    out never ends its successor's; ``holds`` is this process's view (tokens it took, until
    their lease would have expired). Every call goes through the tier's circuit and raises on
    a Redis failure: callers count it and encode locally.
    """

    def __init__(self, tier: RedisTier, lease_ms: int) -> None:
        if lease_ms < 1:
            raise ValueError(f"encoder_store_lease_ms must be >= 1 for a lease, got {lease_ms}")
        self.tier = tier
        self.lease_ms = lease_ms
        self._prefix = os.urandom(12).hex()
        self._ids = itertools.count()
        self._held: dict[str, tuple[str, float]] = {}  # store key -> (token, expiry)
        self._lock = threading.Lock()

    def acquire(self, skey: str) -> bool:
        """Take the lease (True: this process encodes the item; False: another holds it)."""
        token = f"{self._prefix}-{next(self._ids)}"
        client = self.tier.client
        expiry = time.monotonic() + self.lease_ms / 1000
        if not self.tier.call(client.set, LEASE_PREFIX + skey, token, nx=True, px=self.lease_ms):
            return False
        with self._lock:
            self._held[skey] = (token, expiry)
            if len(self._held) > MAX_HELD:
                del self._held[next(iter(self._held))]
        return True

    def holds(self, skey: str) -> bool:
        with self._lock:
            held = self._held.get(skey)
            if held is not None and held[1] <= time.monotonic():
                del self._held[skey]
                held = None
        return held is not None

    def release(self, skey: str) -> None:
        """Give the lease back (after the item's value is stored); nothing if not held."""
        with self._lock:
            held = self._held.pop(skey, None)
        if held is not None:
            self.tier.call(self.tier.client.eval, _RELEASE, 1, LEASE_PREFIX + skey, held[0])

    def alive(self, skey: str) -> bool:
        """Whether some replica holds the item's lease now."""
        return bool(self.tier.call(self.tier.client.exists, LEASE_PREFIX + skey))
