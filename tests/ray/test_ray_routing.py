"""Image-affinity placement without Ray: rendezvous ranking, the load bound, route keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mmserve.entrypoints.ray.rendezvous import RouteKey, load_cap, place, rank, route_key
from mmserve.entrypoints.ray.routing_stats import RoutingStats
from mmserve.inputs import MultiModalItem, ProcessedPrompt

REPLICAS = ["r0", "r1", "r2"]
ANCHORS = [f"img{i}:576" for i in range(300)]


def test_rank_is_deterministic_and_spreads_anchors() -> None:
    firsts = [rank(REPLICAS, a)[0] for a in ANCHORS]
    assert firsts == [rank(list(reversed(REPLICAS)), a)[0] for a in ANCHORS]
    counts = {r: firsts.count(r) for r in REPLICAS}
    assert all(60 <= c <= 140 for c in counts.values()), counts


def test_removing_a_replica_moves_only_its_anchors() -> None:
    before = {a: rank(REPLICAS, a)[0] for a in ANCHORS}
    after = {a: rank(["r0", "r2"], a)[0] for a in ANCHORS}
    moved = {a for a in ANCHORS if before[a] != after[a]}
    assert moved == {a for a in ANCHORS if before[a] == "r1"}
    for a in moved:  # they go to their second choice
        assert after[a] == rank(REPLICAS, a)[1]


def test_adding_a_replica_takes_anchors_only_for_itself() -> None:
    before = {a: rank(REPLICAS, a)[0] for a in ANCHORS}
    after = {a: rank([*REPLICAS, "r3"], a)[0] for a in ANCHORS}
    assert all(after[a] in (before[a], "r3") for a in ANCHORS)


def test_place_prefers_affinity_until_the_cap_then_spills_in_rank_order() -> None:
    ranked = rank(REPLICAS, "imgA:576")
    top, second, third = ranked
    assert place(ranked, {}, 1.25) == place(ranked, {r: 0 for r in REPLICAS}, 1.25)
    first = place(ranked, {}, 1.25)
    assert first.order == ranked and not first.spilled and first.cap == 1
    # top holds 1, the others 0: cap = ceil(1.25 * 2 / 3) = 1, so the new request spills
    spill = place(ranked, {top: 1}, 1.25)
    assert spill.spilled and spill.order == [second, third] and spill.cap == 1
    # a high factor keeps the affinity
    assert place(ranked, {top: 5}, 10.0).order[0] == top


@given(
    loads=st.lists(st.integers(0, 50), min_size=1, max_size=6),
    factor=st.floats(1.0, 4.0),
    anchor=st.text(max_size=8),
)
def test_place_never_exceeds_the_cap(loads: list[int], factor: float, anchor: str) -> None:
    replicas = [f"r{i}" for i in range(len(loads))]
    in_flight = dict(zip(replicas, loads, strict=True))
    placement = place(rank(replicas, anchor), in_flight, factor)
    chosen = placement.order[0]
    assert in_flight[chosen] + 1 <= placement.cap == load_cap(sum(loads), len(loads), factor)
    # it is the best-ranked replica under the cap, and the fallbacks are the others under it,
    # in rank order: whichever one Ray sends to, the request stays within the cap
    under = [r for r in rank(replicas, anchor) if in_flight[r] + 1 <= placement.cap]
    assert placement.order == under


def test_a_replica_at_the_cap_is_no_fallback() -> None:
    """Ray tries the fallbacks when it finds the first's queue full or its queue-length probe
    late (a loaded machine): one at the cap must not be among them, else the burst that made
    the cap sends it one more (a CI run saw 9 in flight against a cap of 8)."""
    top, second, third = rank(REPLICAS, "imgB:576")
    # 7 in flight: cap = ceil(1.25 * 8 / 3) = 4; top 2 and third 1 have room, second 4 none
    placement = place([top, second, third], {top: 2, second: 4, third: 1}, 1.25)
    assert placement.cap == 4
    assert placement.order == [top, third]


def _prompt(*keys: str, tokens: tuple[int, ...] = (1, 2, 3)) -> ProcessedPrompt:
    items = [MultiModalItem(k, i * 10, 4) for i, k in enumerate(keys)]
    return ProcessedPrompt(list(tokens), items)


def test_route_key_is_the_first_image_whatever_follows() -> None:
    turn1 = route_key(_prompt("A", tokens=(1, 2)), None)
    turn2 = route_key(_prompt("A", "B", tokens=(1, 2, 3, 4)), None)
    other_text = route_key(_prompt("A", tokens=(9, 9, 9)), None)
    assert turn1 == turn2 == other_text == RouteKey("A:4", has_images=True)
    assert route_key(_prompt("B", "A"), None).anchor == "B:4"


def test_text_only_route_key_is_the_salted_leading_tokens() -> None:
    long = tuple(range(200))
    a = route_key(_prompt(tokens=long), None)
    assert a == route_key(_prompt(tokens=long[:64] + (7,) * 50), None)  # only the head counts
    assert a != route_key(_prompt(tokens=(5, *long[1:])), None)
    assert a != route_key(_prompt(tokens=long), "tenant-1")
    assert not a.has_images and a.pin is None


def test_routing_stats_count_reservations_in_flight_and_the_cap() -> None:
    stats = RoutingStats()
    stats.set_replicas(["b", "a"])
    stats.reserve("q1", "a", "a", cap=1)
    stats.reserve("q2", "a", "a", cap=2)
    assert stats.loads() == {"a": 2, "b": 0}  # chosen, not dispatched yet: counted
    stats.reserve("q2", "a", "a", cap=2)  # chosen again (a retry): still counted once
    assert stats.loads() == {"a": 2, "b": 0}
    stats.on_routed("q1", "a", "affinity")
    stats.on_routed("q2", "a", "affinity")
    stats.reserve("q3", "b", "a", cap=2)  # spilled
    stats.on_routed("q3", "b", "affinity")
    stats.on_routed("q4", "a", "pinned")
    assert stats.loads() == {"a": 3, "b": 1}
    for rid in ("q1", "q4", "q1", "unknown"):  # twice / unknown: no effect
        stats.on_completed(rid, "a")
    snap = stats.snapshot()
    assert snap["in_flight"] == {"a": 1, "b": 1}
    assert snap["decisions"] == {"affinity": 2, "spill": 1, "pinned": 1}
    assert snap["routed"] == {"a": 2, "b": 1}  # generation requests: the stats call is not one
    assert snap["over_cap"] == 0 and snap["peak_in_flight"] == {"a": 3, "b": 1}
    assert snap["replicas"] == ["a", "b"]


def test_routing_stats_count_a_choice_over_its_cap() -> None:
    stats = RoutingStats()
    stats.set_replicas(["a"])
    stats.on_routed("q0", "a", "pinned")
    stats.reserve("q1", "a", "a", cap=1)  # 1 in flight + this one > 1
    assert stats.snapshot()["over_cap"] == 1


def test_a_dead_replica_is_dropped_with_its_in_flight_count() -> None:
    stats = RoutingStats()
    stats.set_replicas(["a", "b"])
    stats.on_routed("q1", "a", "affinity")
    stats.drop_replica("a")
    assert stats.loads() == {"b": 0} and stats.snapshot()["replicas"] == ["b"]
    stats.on_completed("q1", "a")  # Ray reports it later: no effect
    assert stats.snapshot()["in_flight"] == {}


def test_a_refused_sends_completion_does_not_uncount_the_retry() -> None:
    """Ray calls back on_request_completed for a send the replica refused, possibly after the
    retry was reserved (or routed) elsewhere: it must not lower the retry's count."""
    stats = RoutingStats()
    stats.set_replicas(["a", "b"])
    stats.reserve("q1", "b", "a", cap=1)  # the retry after "a" refused
    stats.on_completed("q1", "a")  # the refused send's callback, late
    assert stats.loads() == {"a": 0, "b": 1}
    stats.on_routed("q1", "b", "affinity")
    stats.on_completed("q1", "a")
    assert stats.snapshot()["in_flight"] == {"b": 1}
    stats.on_completed("q1", "b")
    assert stats.loads() == {"a": 0, "b": 0}
