"""Items another replica is encoding (a pending store wait) in the scheduler: never scheduled
while pending, never holding anyone else back, then a load or an encode."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

from mmserve.request import Request
from tests.support.scheduler import assert_all_free, fake_step, make_request, make_scheduler


def awaiting(request: Request, idx: int) -> Future:
    """Item ``idx`` waits for another replica's encode (as admission attaches it)."""
    future: Future = Future()
    request.mm_items[idx] = dataclasses.replace(request.mm_items[idx], awaited=future)
    request.may_await_store = True
    return future


def test_a_pending_item_is_not_scheduled_its_text_and_other_requests_run_then_it_loads():
    sched = make_scheduler(budget=200)
    held = make_request("held", [4, ("a", 20), 4])
    wait = awaiting(held, 0)
    other = make_request("other", [4, ("b", 20), 4])
    sched.add_request(held)
    sched.add_request(other)
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"held": 4, "other": 28}  # held runs up to the image
    assert out.scheduled_encoder_inputs == {"other": [0]} and not out.scheduled_encoder_loads
    assert sched.held_for_store == 1
    for _ in range(3):  # other decodes; held waits, holding no cache space
        out = fake_step(sched)
        assert "held" not in out.num_scheduled_tokens and sched.held_for_store == 1
    assert "a" not in {key.split(":")[0] for key in sched.encoder_cache.referenced}
    stored = object()
    wait.set_result(stored)  # the holder stored it
    out = fake_step(sched)
    assert out.scheduled_encoder_loads == {"held": [0]} and not out.scheduled_encoder_inputs
    assert held.mm_items[0].awaited is None and sched.held_for_store == 0
    assert sched.counters["encoder_store_loads"] == 1
    while sched.has_unfinished_requests():
        fake_step(sched)
    assert held.mm_items[0].stored is None  # dropped once reached, as any load
    assert_all_free(sched)


def test_a_wait_that_ends_without_a_result_is_encoded():
    sched = make_scheduler(budget=200)
    held = make_request("held", [("a", 20), 4])
    wait = awaiting(held, 0)
    sched.add_request(held)
    assert fake_step(sched).is_empty and sched.held_for_store == 1
    wait.set_result(None)  # the lease ended without a stored value: encode here
    out = fake_step(sched)
    assert out.scheduled_encoder_inputs == {"held": [0]} and not out.scheduled_encoder_loads


def test_a_waiting_request_held_at_its_first_item_is_passed_over_keeping_its_place():
    sched = make_scheduler(budget=200, max_num_seqs=2)
    first = make_request("first", [("a", 20), 4])
    wait = awaiting(first, 0)
    sched.add_request(first)
    sched.add_request(make_request("second", [("b", 20), 4], max_tokens=50))
    out = fake_step(sched)
    assert list(out.num_scheduled_tokens) == ["second"]  # admitted past the held one
    assert [r.req_id for r in sched.waiting] == ["first"]
    sched.add_request(make_request("third", [6], max_tokens=50))
    out = fake_step(sched)
    assert "third" in out.num_scheduled_tokens  # still passed over while pending
    wait.set_result(object())
    sched.finish_requests(["third"], sched.requests["third"].status.FINISHED_ABORTED)
    out = fake_step(sched)
    assert out.scheduled_encoder_loads == {"first": [0]}


def test_a_cached_item_is_a_hit_even_while_its_wait_is_pending():
    sched = make_scheduler(budget=200)
    sched.add_request(make_request("encoder", [("a", 20), 4]))
    held = make_request("held", [("a", 20), 6])
    awaiting(held, 0)
    sched.add_request(held)
    out = fake_step(sched)
    assert out.scheduled_encoder_inputs == {"encoder": [0]} and not out.scheduled_encoder_loads
    assert held.num_computed_tokens == held.num_prompt_tokens  # its image found in the cache
    assert sched.held_for_store == 0
