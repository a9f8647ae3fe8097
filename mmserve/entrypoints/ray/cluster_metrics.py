"""Prometheus export of the ingress: routing decisions and the freshness of the replicas' sum,
and the bounded refresh of that sum on a ``/metrics`` scrape.

No Ray import here: the router's counts come through ``routing_stats.ROUTING.snapshot``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

DECISIONS = ("affinity", "spill", "pow2", "pinned", "unkeyed")
MIN_REFRESH_INTERVAL_S = 1.0  # scrapes closer together share the previous refresh
REFRESH_WAIT_S = 2.0  # a scrape waits this long for fresh replica stats, then serves the last


class RoutingCollector(Collector):
    """Exports a ``RoutingStats.snapshot()`` and the age of the replicas' summed counters.

    Every decision kind is exported (0 until it happens), so a dashboard's queries never miss a
    series; per-replica series carry a ``replica`` label (Serve's replica id).
    """

    def __init__(
        self,
        routing: Callable[[], Mapping[str, Any]],
        freshness: Callable[[], Mapping[str, float]],
    ) -> None:
        self._routing = routing
        self._freshness = freshness

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snap, fresh = dict(self._routing()), dict(self._freshness())
        except Exception:  # a scrape must never fail because of a bad snapshot
            logger.exception("reading the routing snapshot failed")
            return
        decisions = CounterMetricFamily(
            "mmserve_routing_decisions",
            "Requests routed to an engine replica, by decision (affinity: the image's replica;"
            " spill: the next one past the load bound; pow2; pinned: stats calls; unkeyed).",
            labels=["decision"],
        )
        for kind in sorted({*DECISIONS, *snap.get("decisions", {})}):
            decisions.add_metric([kind], float(snap.get("decisions", {}).get(kind, 0)))
        yield decisions
        yield _per_replica(
            CounterMetricFamily(
                "mmserve_routing_requests_routed",
                "Generation requests routed to each replica by this ingress (stats calls: pinned).",
                labels=["replica"],
            ),
            snap.get("routed", {}),
        )
        replicas = snap.get("replicas", [])
        in_flight = snap.get("in_flight", {})
        yield _per_replica(
            GaugeMetricFamily(
                "mmserve_routing_in_flight",
                "Requests routed to each replica and not completed yet.",
                labels=["replica"],
            ),
            {r: in_flight.get(r, 0) for r in replicas},
        )
        yield _per_replica(
            GaugeMetricFamily(
                "mmserve_routing_peak_in_flight",
                "Most requests in flight at once on each replica.",
                labels=["replica"],
            ),
            snap.get("peak_in_flight", {}),
        )
        yield CounterMetricFamily(
            "mmserve_routing_over_cap",
            "Routing choices that put their replica above the load cap (the bound says 0).",
            value=float(snap.get("over_cap", 0)),
        )
        yield GaugeMetricFamily(
            "mmserve_cluster_replicas", "Engine replicas the router knows.", value=len(replicas)
        )
        yield GaugeMetricFamily(
            "mmserve_cluster_replicas_reporting",
            "Replicas whose counters the last refresh summed (the mmserve_* engine metrics).",
            value=fresh.get("replicas_reporting", 0),
        )
        yield GaugeMetricFamily(
            "mmserve_cluster_stats_age_seconds",
            "Seconds since the replicas' engine counters were last summed (-1: never).",
            value=fresh.get("age_seconds", -1.0),
        )


def _per_replica(family: Any, values: Mapping[str, float]) -> Any:
    for replica in sorted(values):
        family.add_metric([replica], float(values[replica]))
    return family


class StatsRefresher:
    """Refreshes the replicas' stats for a scrape, bounded so scrapes cannot flood replicas.

    Invariants: at most one refresh runs at a time, and concurrent callers share it; a new one
    starts only ``min_interval_s`` after the previous one started; a caller waits at most
    ``wait_s`` (the refresh goes on in the background and the caller serves the last sum); a
    failed refresh is logged and leaves the last sum in place. Event loop only.
    """

    def __init__(
        self,
        refresh: Callable[[], Awaitable[Any]],
        *,
        min_interval_s: float = MIN_REFRESH_INTERVAL_S,
        wait_s: float = REFRESH_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._refresh = refresh
        self.min_interval_s = min_interval_s
        self.wait_s = wait_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._started_at: float | None = None
        self.refreshes = 0

    async def __call__(self) -> None:
        task = self._task
        if task is None or task.done():
            now = self._clock()
            if self._started_at is not None and now - self._started_at < self.min_interval_s:
                return
            self._started_at = now
            self.refreshes += 1
            self._task = task = asyncio.create_task(self._run())
        try:  # shield: a caller timing out or cancelled leaves the refresh to finish
            await asyncio.wait_for(asyncio.shield(task), self.wait_s)
        except asyncio.TimeoutError:
            logger.debug("replica stats took over %.1f s; serving the last ones", self.wait_s)

    async def _run(self) -> None:
        try:
            await self._refresh()
        except Exception:
            logger.exception("refreshing the replicas' stats failed")
