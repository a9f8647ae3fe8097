"""The ingress' sum of the replicas' engine metrics (``ClusterCounterSums``, no Ray needed):
summed counters never go down when a replica misses a refresh, is replaced or restarts (a
Prometheus counter that drops reads as a reset, and rate() then jumps); gauges are summed over
the replicas that reported."""

from __future__ import annotations

from mmserve.entrypoints.ray.counter_sums import ClusterCounterSums

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
