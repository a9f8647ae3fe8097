"""The ingress' sum of the replicas' engine metrics (``ClusterCounterSums``, no Ray needed):
summed counters never go down when a replica misses a refresh, is replaced or restarts (a
Prometheus counter that drops reads as a reset, and rate() then jumps); gauges are summed over
the replicas that reported."""

from __future__ import annotations

import asyncio

from mmserve.entrypoints.ray.counter_sums import ClusterCounterSums, ClusterStatsCollector

COUNTERS = frozenset({"encoder_images_encoded", "num_requests_finished"})


def report(encoded: int, finished: int, running: int) -> dict[str, object]:
    return {
        "replica": "ignored: not a number",
        "encoder_images_encoded": encoded,
        "num_requests_finished": finished,
        "num_requests_running": running,
        "kv_block_size": 16,
    }


def test_counters_stay_monotonic_across_missed_refreshes_replacements_and_restarts() -> None:
    sums = ClusterCounterSums(COUNTERS, not_summed=frozenset({"kv_block_size"}))
    total = sums.add({"a": report(5, 2, 1), "b": report(3, 1, 2)}, known=["a", "b"])
    assert total == {"encoder_images_encoded": 8, "num_requests_finished": 3,
                     "num_requests_running": 3}  # fmt: skip
    # b is still a replica but did not answer in time: its counters stay, its gauges go
    total = sums.add({"a": report(6, 2, 0)}, known=["a", "b"])
    assert total == {"encoder_images_encoded": 9, "num_requests_finished": 3,
                     "num_requests_running": 0}  # fmt: skip
    # b was replaced by c: what b counted is still part of the cluster's totals
    total = sums.add({"a": report(6, 3, 0), "c": report(1, 0, 1)}, known=["a", "c"])
    assert total["encoder_images_encoded"] == 6 + 3 + 1
    assert total["num_requests_finished"] == 3 + 1 + 0
    assert total["num_requests_running"] == 1
    # a's engine restarted (its counters went down): the sum keeps what it had counted
    total = sums.add({"a": report(2, 0, 0), "c": report(1, 0, 0)}, known=["a", "c"])
    assert total["encoder_images_encoded"] == 6 + 2 + 3 + 1
    assert total["num_requests_finished"] == 3 + 0 + 1 + 0


def test_a_replica_gone_before_it_ever_reported_adds_nothing() -> None:
    sums = ClusterCounterSums(COUNTERS)
    assert sums.add({}, known=["a"]) == {}
    assert sums.add({"b": report(1, 1, 1)}, known=["b"])["encoder_images_encoded"] == 1


def test_a_replica_that_leaves_the_known_list_and_returns_is_counted_once() -> None:
    sums = ClusterCounterSums(COUNTERS)
    assert sums.add({"a": report(10, 0, 0)}, known=["a"])["encoder_images_encoded"] == 10
    assert sums.add({}, known=[])["encoder_images_encoded"] == 10  # dropped for a moment
    assert sums.add({"a": report(11, 0, 0)}, known=["a"])["encoder_images_encoded"] == 11


def test_departed_replicas_are_folded_beyond_a_bound() -> None:
    sums = ClusterCounterSums(COUNTERS, max_departed=2)
    for i in range(5):  # five replicas, each replaced by the next
        total = sums.add({f"r{i}": report(1, 0, 0)}, known=[f"r{i}"])
        assert total["encoder_images_encoded"] == i + 1
    assert len(sums._last) <= 1 + 2


def test_overlapping_collections_fold_reports_in_the_order_they_were_read() -> None:
    """A /cluster call overlapping a /metrics refresh: without one collection at a time, the
    later read of r0 (110) folded first, then the earlier one (100) read as a restart."""
    reads = {"r0": [100, 110], "r1": [5, 5]}
    slow = asyncio.Event()

    async def fetch(name: str) -> dict[str, object]:
        if name == "r1" and not slow.is_set():
            slow.set()
            await asyncio.sleep(0.05)  # the first collection waits on a slow r1
        return {"encoder_images_encoded": reads[name].pop(0)}

    async def main() -> list[float]:
        collector = ClusterStatsCollector(fetch, ClusterCounterSums(COUNTERS))
        first = asyncio.create_task(collector.collect(["r0", "r1"]))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(collector.collect(["r0", "r1"]))
        results = [await first, await second]
        return [total["encoder_images_encoded"] for _, total in results]

    assert asyncio.run(main()) == [105, 115]


def test_a_replica_that_does_not_answer_is_left_out_of_the_reports() -> None:
    async def fetch(name: str) -> dict[str, object]:
        if name == "r1":
            raise TimeoutError("no answer")
        return {"encoder_images_encoded": 3}

    collector = ClusterStatsCollector(fetch, ClusterCounterSums(COUNTERS))
    reports, total = asyncio.run(collector.collect(["r0", "r1"]))
    assert list(reports) == ["r0"] and total == {"encoder_images_encoded": 3}
