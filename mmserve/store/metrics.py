"""The encoder store's counters, shared by its lookup and writer threads."""

from __future__ import annotations

import threading
from collections import defaultdict

TIERS = ("ram", "disk", "redis")
TIER_FIELDS = ("hits", "misses", "errors", "bytes", "lookup_seconds")
STORE_FIELDS = ("writes", "writes_dropped", "write_errors", "mac_failures", "corrupt_entries",
                "late_lookups", "lease_acquired", "lease_waits", "lease_loaded",
                "lease_takeovers")  # fmt: skip


class StoreMetrics:
    """Monotonic counters: per tier ``hits``, ``misses``, ``errors`` (failed or skipped
    calls), ``bytes`` (read on hits) and ``lookup_seconds``; store-wide ``writes``,
    ``writes_dropped`` (queue full), ``write_errors``, ``mac_failures``, ``corrupt_entries``
    (every verification failure, MAC ones included), ``late_lookups`` (past the deadline) and
    the encode lease's ``lease_acquired``, ``lease_waits``, ``lease_loaded`` and
    ``lease_takeovers`` (``LeaseWaits`` says what each counts).

    Invariant: names are ``<tier>_<field>`` or a store field; ``add`` is atomic."""

    def __init__(self) -> None:
        self._counts: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            self._counts[name] += value

    def get(self, name: str) -> float:
        return self._counts.get(name, 0.0)

    def snapshot(self) -> dict[str, float]:
        names = [f"{t}_{f}" for t in TIERS for f in TIER_FIELDS] + list(STORE_FIELDS)
        with self._lock:
            return {name: self._counts.get(name, 0.0) for name in names}
