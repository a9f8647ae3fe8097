"""The scheduler's side of ``n > 1`` (no tensors): children wait for their leader's prefill,
then take its prompt blocks from the prefix cache; the prompt is prefilled and its image
encoded once however the prefill is chunked."""

from __future__ import annotations

import pytest

from mmserve.request import Request
from tests.support.scheduler import assert_all_free, fake_step, make_request, make_scheduler

LAYOUT: list[int | tuple[str, int]] = [5, ("img", 40), 30]  # 75 prompt tokens


def _children(n: int, leader_gate: bool = True) -> list[Request]:
    leader = make_request("0_p", LAYOUT, max_tokens=3)
    out = [leader]
    for i in range(1, n):
        child = make_request(f"{i}_p", LAYOUT, max_tokens=3)
        child.prefill_leader = leader if leader_gate else None
        out.append(child)
    return out


@pytest.mark.parametrize("budget", [512, 32])
def test_children_prefill_only_the_partial_last_block(budget):
    sched = make_scheduler(budget=budget)
    children = _children(3)
    for child in children:
        sched.add_request(child)
    scheduled = encodes = 0
    while sched.has_unfinished_requests():
        out = fake_step(sched)
        scheduled += out.total_num_scheduled_tokens
        encodes += sum(len(v) for v in out.scheduled_encoder_inputs.values())
    shared = (75 - 1) // 16 * 16  # a hit never covers the last prompt token
    assert [c.num_cached_tokens for c in children] == [0, shared, shared]
    # the prompt once, each other child's partial last block, two decode steps per child
    assert scheduled == 75 + 2 * (75 - shared) + 3 * 2
    assert encodes == 1
    assert sched.kv.prefix_cache_hits == 2 * shared
    assert_all_free(sched)


def test_a_child_waits_while_its_leader_prefills_and_holds_the_queue():
    """The leader stops before its second image (encoder budget), leaving token budget: without
    the gate the child would start prefilling the same prompt beside it."""
    layout: list[int | tuple[str, int]] = [5, ("a", 40), 5, ("b", 40), 20]  # 110 tokens
    sched = make_scheduler(budget=100, encoder_budget=40)
    leader = make_request("0_p", layout, max_tokens=2)
    child = make_request("1_p", layout, max_tokens=2)
    child.prefill_leader = leader
    other = make_request("other", [20], max_tokens=1)
    for request in (leader, child, other):
        sched.add_request(request)
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"0_p": 50}
    assert child.waits_for_leader and child in sched.waiting and other in sched.waiting
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"0_p": 60, "1_p": 110 - 96, "other": 20}
    assert child.num_cached_tokens == 96 and "1_p" not in out.scheduled_encoder_inputs
    while sched.has_unfinished_requests():
        fake_step(sched)
    assert_all_free(sched)
