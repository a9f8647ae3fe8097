"""``ImageAffinityRouter.choose_replicas`` without a cluster: fake replicas and requests."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="the router needs the mmserve[ray] extra")

from mmserve.entrypoints.ray import router as router_module  # noqa: E402
from mmserve.entrypoints.ray import routing_stats  # noqa: E402
from mmserve.entrypoints.ray.rendezvous import RouteKey  # noqa: E402
from mmserve.entrypoints.ray.router import ImageAffinityRouter  # noqa: E402


def replica(name: str) -> Any:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name))


def pending(request_id: str, route: RouteKey | None) -> Any:
    kwargs = {} if route is None else {"route": route}
    return SimpleNamespace(kwargs=kwargs, metadata=SimpleNamespace(internal_request_id=request_id))


def router(policy: str) -> ImageAffinityRouter:
    r = object.__new__(ImageAffinityRouter)  # Ray's constructor needs a deployment; not used
    r.initialize_state(policy=policy)
    return r


def names(ranks: list[list[Any]]) -> list[list[str]]:
    return [[str(r.replica_id.unique_id) for r in rank] for rank in ranks]


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> routing_stats.RoutingStats:
    fresh = routing_stats.RoutingStats()
    monkeypatch.setattr(routing_stats, "ROUTING", fresh)
    fresh.set_replicas(["a", "b", "c"])
    for i in range(3):  # a: 3 in flight, b: 0, c: 5
        fresh.on_routed(f"old-a{i}", "a", "unkeyed")
    for i in range(5):
        fresh.on_routed(f"old-c{i}", "c", "unkeyed")
    return fresh


def test_pow2_ranks_the_reserved_least_loaded_first_and_the_other_as_fallback(
    stats: routing_stats.RoutingStats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router_module.random, "sample", lambda names, k: ["a", "b"])
    pow2 = router("pow2")
    request = pending("req-1", RouteKey(anchor="img:576", has_images=True))
    candidates = [replica(n) for n in ("a", "b", "c")]
    ranks = asyncio.run(pow2.choose_replicas(candidates, request))
    assert names(ranks) == [["b"], ["a"]]  # one per rank: Ray tries b, then a
    assert stats.loads() == {"a": 3, "b": 1, "c": 5}  # reserved on the one tried first
    pow2.on_request_routed(request, replica("b").replica_id, None)
    assert stats.snapshot()["decisions"]["pow2"] == 1
    assert stats.snapshot()["in_flight"] == {"a": 3, "b": 1, "c": 5}
    assert stats.loads() == {"a": 3, "b": 1, "c": 5}  # the reservation became the in-flight


def test_pow2_with_one_replica_and_unkeyed_calls(stats: routing_stats.RoutingStats) -> None:
    pow2 = router("pow2")
    keyed = pending("req-2", RouteKey(anchor="img:576", has_images=True))
    assert names(asyncio.run(pow2.choose_replicas([replica("c")], keyed))) == [["c"]]
    unkeyed = pending("req-3", None)
    ranks = asyncio.run(pow2.choose_replicas([replica(n) for n in "abc"], unkeyed))
    assert names(ranks) == [["b"], ["a"], ["c"]]  # least loaded first, c's reservation counted
