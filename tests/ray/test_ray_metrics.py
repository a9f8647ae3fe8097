"""The ingress' Prometheus export without Ray: routing counters and the bounded stats refresh."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmserve.entrypoints.ray.cluster_metrics import RoutingCollector, StatsRefresher
from mmserve.entrypoints.ray.routing_stats import RoutingStats


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_routing_counters_are_exported_per_decision_and_replica() -> None:
    stats = RoutingStats()
    stats.set_replicas(["r1", "r0"])
    stats.reserve("a", "r0", "r0", cap=1)
    stats.on_routed("a", "r0", "affinity")
    stats.reserve("b", "r1", "r0", cap=1)
    stats.on_routed("b", "r1", "affinity")  # not the top choice: a spill
    stats.on_routed("c", "r1", "pinned")
    stats.on_completed("c", "r1")
    registry = CollectorRegistry()
    fresh = {"replicas_reporting": 2, "age_seconds": 0.5}
    registry.register(RoutingCollector(stats.snapshot, lambda: fresh))
    got = samples(registry)
    decisions = {
        dict(labels)["decision"]: value
        for (name, labels), value in got.items()
        if name == "mmserve_routing_decisions_total"
    }
    assert decisions == {"affinity": 1, "spill": 1, "pinned": 1, "pow2": 0, "unkeyed": 0}
    assert got[("mmserve_routing_requests_routed_total", (("replica", "r0"),))] == 1
    # the stats call is a "pinned" decision, not a request routed to r1
    assert got[("mmserve_routing_requests_routed_total", (("replica", "r1"),))] == 1
    assert got[("mmserve_routing_in_flight", (("replica", "r0"),))] == 1
    assert got[("mmserve_routing_in_flight", (("replica", "r1"),))] == 1
    assert got[("mmserve_routing_peak_in_flight", (("replica", "r1"),))] == 2
    assert got[("mmserve_routing_over_cap_total", ())] == 0
    assert got[("mmserve_cluster_replicas", ())] == 2
    assert got[("mmserve_cluster_replicas_reporting", ())] == 2
    assert got[("mmserve_cluster_stats_age_seconds", ())] == 0.5


def test_a_broken_routing_snapshot_does_not_fail_the_scrape() -> None:
    registry = CollectorRegistry()
    registry.register(RoutingCollector(lambda: 1 / 0, dict))  # type: ignore[arg-type,return-value]
    assert samples(registry) == {}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_concurrent_scrapes_share_one_refresh_and_the_min_interval_holds() -> None:
    clock, calls = FakeClock(), []

    async def refresh() -> None:
        calls.append(clock.now)
        await asyncio.sleep(0.05)

    async def main() -> None:
        refresher = StatsRefresher(refresh, min_interval_s=1.0, wait_s=5.0, clock=clock)
        await asyncio.gather(*(refresher() for _ in range(20)))
        assert calls == [100.0]
        clock.now = 100.5
        await refresher()  # within the interval: the last sum is served
        assert calls == [100.0]
        clock.now = 101.0
        await refresher()
        assert calls == [100.0, 101.0]

    asyncio.run(main())


def test_a_slow_refresh_is_waited_for_boundedly_and_finishes_in_the_background() -> None:
    done: list[bool] = []

    async def main() -> None:
        gate = asyncio.Event()

        async def refresh() -> None:
            await gate.wait()
            done.append(True)

        clock = FakeClock()
        refresher = StatsRefresher(refresh, min_interval_s=1.0, wait_s=0.05, clock=clock)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await refresher()
        assert loop.time() - start < 1.0 and not done
        clock.now += 10
        await refresher()  # still running: shared, not a second one
        assert refresher.refreshes == 1
        gate.set()
        await asyncio.sleep(0.01)
        assert done == [True]

    asyncio.run(main())


def test_a_failing_refresh_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def refresh() -> None:
        raise RuntimeError("replica gone")

    asyncio.run(StatsRefresher(refresh, wait_s=1.0)())
    assert "refreshing the replicas' stats failed" in caplog.text
