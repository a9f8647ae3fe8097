"""The replicas' engine metrics summed for the ingress' ``/metrics`` and ``/cluster``, with
counters kept monotonic: Prometheus reads a counter that goes down as a reset, and ``rate()``
then jumps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

MAX_DEPARTED = 64  # departed replicas kept by name (one may come back) before folding


class ClusterCounterSums:
    """Sums per-replica engine metrics across refreshes.

    Invariants: every summed counter is non-decreasing from one ``add`` to the next, given
    reports folded in the order they were read (``ClusterStatsCollector`` ensures it). A
    replica that misses a refresh, or is no longer ``known`` (replaced, scaled down), keeps
    contributing the last counter values it reported, under its name, so one that comes back
    is counted once; a replica's counter that goes down (its engine restarted) first adds its
    previous value to the retired part. Beyond ``max_departed`` departed replicas the oldest is
    folded into the retired part. Gauges are summed over the replicas that reported in this
    refresh only.
    """

    def __init__(
        self,
        counters: frozenset[str],
        not_summed: frozenset[str] = frozenset(),
        max_departed: int = MAX_DEPARTED,
    ) -> None:
        self._counters = counters
        self._not_summed = not_summed
        self._max_departed = max_departed
        self._last: dict[str, dict[str, float]] = {}  # replica -> counter -> last value
        self._retired: dict[str, float] = {}  # folded departed replicas' and restarts' counts

    def add(
        self, reports: Mapping[str, Mapping[str, Any]], known: Iterable[str]
    ) -> dict[str, float]:
        """Fold in this refresh's ``reports`` (replica -> its metrics) and return the sums;
        ``known``: the replicas that exist now."""
        gauges: dict[str, float] = {}
        for replica, stats in reports.items():
            last = self._last.pop(replica, {})
            self._last[replica] = last  # insertion order: least recently reported first
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
        self._fold_departed(set(known) | set(reports))
        total = dict(self._retired)
        for values in self._last.values():
            _add_into(total, values)
        return {**gauges, **total}

    def _fold_departed(self, present: set[str]) -> None:
        departed = [r for r in self._last if r not in present]
        for replica in departed[: max(0, len(departed) - self._max_departed)]:
            _add_into(self._retired, self._last.pop(replica))


class ClusterStatsCollector:
    """Reads each replica's stats one at a time (``fetch``; one that fails is left out and
    logged) and folds them into a ``ClusterCounterSums``. One collection runs at a time, so
    reports are folded in the order they were read: an overlapping ``/cluster`` call waits for
    the ``/metrics`` refresh in progress instead of folding an older read after a newer one."""

    def __init__(
        self, fetch: Callable[[str], Awaitable[Mapping[str, Any]]], sums: ClusterCounterSums
    ) -> None:
        self._fetch = fetch
        self._sums = sums
        self._lock = asyncio.Lock()

    async def collect(
        self, replicas: list[str]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
        """Each answering replica's stats, and the sums with them folded in."""
        async with self._lock:
            reports: dict[str, dict[str, Any]] = {}
            for name in replicas:  # one at a time: see ImageAffinityRouter
                try:
                    reports[name] = dict(await self._fetch(name))
                except Exception as exc:
                    logger.warning("replica %s did not report its stats: %r", name, exc)
            return reports, self._sums.add(reports, known=replicas)


def _add_into(total: dict[str, float], values: Mapping[str, float]) -> None:
    for key, value in values.items():
        total[key] = total.get(key, 0) + value
