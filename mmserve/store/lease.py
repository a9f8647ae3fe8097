"""The encode lease: which of the replicas sharing Redis encodes an item they all missed."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass

from mmserve.store.redis_tier import RedisTier

logger = logging.getLogger(__name__)

LEASE_PREFIX = "mmserve:lease:"
MAX_HELD = 4096  # tokens remembered at once; an older one is forgotten (its lease expires)
MAX_HOLD_S = 60.0  # renewals stop this long after the lease was taken: a hung holder's limit
# delete the lease only if it still carries the caller's token (a compare-and-delete)
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# extend the lease only if it still carries the caller's token (a compare-and-extend)
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""


@dataclass
class _Held:
    token: str
    expiry: float  # monotonic: when the lease runs out unless renewed
    until: float  # monotonic: no renewal after this (``max_hold_s`` after it was taken)


class EncodeLease:
    """A short lease per store key in the shared Redis: ``SET NX PX`` with a random token,
    renewed by its holder while it holds it.

    Invariants: at most one holder per store key at a time; a daemon thread of the holder's
    process renews every lease it holds every third of ``lease_ms`` (compare-and-extend on the
    token), from ``acquire`` until ``release``, ``close``, a renewal that finds another token
    (or none: the lease was lost, and is never extended into a successor's), or
    ``max_hold_s`` after it was taken; so a holder that dies (its thread with it) or whose
    renewals fail holds nobody up for longer than ``lease_ms``, and a live one that hangs for
    longer than ``max_hold_s`` plus ``lease_ms``; only the token that took it releases it
    (compare-and-delete), so a holder whose lease ran out never ends its successor's;
    ``holds`` is this process's view (tokens it took, until their lease would have expired as
    of the last renewal that succeeded). ``acquire``, ``release`` and ``alive`` go through the
    tier's circuit and raise on a Redis failure (callers count it and encode locally);
    renewals go around it (background calls, a few a second: one slow reply that opened the
    circuit must not let every held lease expire) and a failed one is retried at the next.
    """

    def __init__(self, tier: RedisTier, lease_ms: int, max_hold_s: float = MAX_HOLD_S) -> None:
        if lease_ms < 1:
            raise ValueError(f"encoder_store_lease_ms must be >= 1 for a lease, got {lease_ms}")
        self.tier = tier
        self.lease_ms = lease_ms
        self.max_hold_s = max_hold_s
        self._prefix = os.urandom(12).hex()
        self._ids = itertools.count()
        self._held: dict[str, _Held] = {}  # store key -> what this process holds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, skey: str) -> bool:
        """Take the lease (True: this process encodes the item; False: another holds it)."""
        token = f"{self._prefix}-{next(self._ids)}"
        client = self.tier.client
        now = time.monotonic()
        if not self.tier.call(client.set, LEASE_PREFIX + skey, token, nx=True, px=self.lease_ms):
            return False
        with self._lock:
            self._held[skey] = _Held(token, now + self.lease_ms / 1000, now + self.max_hold_s)
            if len(self._held) > MAX_HELD:
                del self._held[next(iter(self._held))]
            if self._renewer is None and not self._stop.is_set():
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="mmserve-store-lease-renewal", daemon=True
                )
                self._renewer.start()
        return True

    def holds(self, skey: str) -> bool:
        with self._lock:
            held = self._held.get(skey)
            if held is not None and held.expiry <= time.monotonic():
                del self._held[skey]
                held = None
        return held is not None

    @property
    def holding(self) -> bool:
        """Whether this process holds any lease (a cheap check before per-key work)."""
        return bool(self._held)

    def release(self, skey: str) -> None:
        """Give the lease back (after the item's value is stored); nothing if not held."""
        with self._lock:
            held = self._held.pop(skey, None)
        if held is not None:
            self.tier.call(self.tier.client.eval, _RELEASE, 1, LEASE_PREFIX + skey, held.token)

    def alive(self, skey: str) -> bool:
        """Whether some replica holds the item's lease now."""
        return bool(self.tier.call(self.tier.client.exists, LEASE_PREFIX + skey))

    def close(self) -> None:
        """Stop renewing and give back every lease still held (best effort: one that fails
        to be released expires)."""
        self._stop.set()
        with self._lock:
            held = list(self._held)
        for skey in held:
            try:
                self.release(skey)
            except Exception as exc:
                logger.debug("encoder store: releasing the lease of %s failed (%s)", skey, exc)
        if self._renewer is not None:
            self._renewer.join(self.lease_ms / 1000 + 1.0)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            self.renew()

    def renew(self) -> None:
        """Extend every lease held and within its hold limit by ``lease_ms`` (the renewal
        thread's turn; forgets those another token, or nobody, holds now)."""
        now = time.monotonic()
        with self._lock:
            due = [(skey, held) for skey, held in self._held.items() if now < held.until]
        for skey, held in due:
            try:  # around the circuit: a slow reply to a lookup must not cost a holder its lease
                kept = self.tier.client.eval(
                    _RENEW, 1, LEASE_PREFIX + skey, held.token, self.lease_ms
                )
            except Exception as exc:  # the lease expires unless a later renewal gets through
                logger.debug("encoder store: renewing the lease of %s failed (%s)", skey, exc)
                continue
            with self._lock:
                if self._held.get(skey) is not held:
                    continue  # released (or taken again) meanwhile
                if kept:
                    held.expiry = now + self.lease_ms / 1000
                else:
                    del self._held[skey]
