"""The replicas' engine metrics summed for the ingress' ``/metrics``, with counters kept
monotonic: Prometheus reads a counter that goes down as a reset, and ``rate()`` then jumps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class ClusterCounterSums:
    """Sums per-replica engine metrics across refreshes.

    Invariants: every summed counter is non-decreasing from one ``add`` to the next. A replica
    that misses a refresh, or is no longer ``known`` (replaced, scaled down), keeps contributing
    the last counter values it reported; a replica's counter that goes down (its engine
    restarted) first adds its previous value to the retired part. Gauges are summed over the
    replicas that reported in this refresh only. Memory: one entry per known replica, plus one
    retired total per counter name.
    """

    def __init__(self, counters: frozenset[str], not_summed: frozenset[str] = frozenset()) -> None:
        self._counters = counters
        self._not_summed = not_summed
        self._last: dict[str, dict[str, float]] = {}  # known replica -> counter -> last value
        self._retired: dict[str, float] = {}  # departed replicas' and restarts' counts

    def add(
        self, reports: Mapping[str, Mapping[str, Any]], known: Iterable[str]
    ) -> dict[str, float]:
        """Fold in this refresh's ``reports`` (replica -> its metrics) and return the sums;
        ``known``: the replicas that exist now (the others are retired)."""
        known = set(known)
        for gone in [r for r in self._last if r not in known]:
            _add_into(self._retired, self._last.pop(gone))
        gauges: dict[str, float] = {}
        for replica, stats in reports.items():
            last = self._last.setdefault(replica, {})
            for key, value in stats.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if key in self._not_summed:
                    continue
                if key not in self._counters:
                    gauges[key] = gauges.get(key, 0) + value
                    continue
                if value < last.get(key, 0):
                    _add_into(self._retired, {key: last[key]})
                last[key] = value
        total = dict(self._retired)
        for values in self._last.values():
            _add_into(total, values)
        return {**gauges, **total}


def _add_into(total: dict[str, float], values: Mapping[str, float]) -> None:
    for key, value in values.items():
        total[key] = total.get(key, 0) + value
