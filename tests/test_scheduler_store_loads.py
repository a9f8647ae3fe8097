"""Encoder-store hits in the scheduler: a load takes cache space but no encoder budget."""

from __future__ import annotations

import dataclasses

from mmserve.core.encoder_scheduling import plan_encoder_inputs
from tests.core_helpers import fake_step, make_request, make_scheduler


def with_stored(request, *indices: int):
    for idx in indices:
        request.mm_items[idx] = dataclasses.replace(request.mm_items[idx], stored=object())
    return request


def test_stored_items_load_without_encoder_budget_and_unstored_ones_still_encode():
    sched = make_scheduler(budget=200, encoder_budget=30, encoder_capacity=100)
    req = with_stored(make_request("r", [4, ("a", 30), 2, ("b", 30), 2, ("c", 30), 4]), 0, 1)
    sched.add_request(req)
    out = sched.schedule()
    assert out.scheduled_encoder_loads == {"r": [0, 1]}  # 60 embeddings > the budget of 30
    assert out.scheduled_encoder_inputs == {"r": [2]}
    assert out.num_scheduled_tokens["r"] == req.num_tokens
    assert sched.counters["encoder_store_loads"] == 2
    assert sched.counters["encoder_cache_misses"] == 1


def test_loads_take_cache_space_and_wait_for_it():
    sched = make_scheduler(budget=200, encoder_budget=100, encoder_capacity=40)
    req = with_stored(make_request("r", [4, ("a", 30), 4, ("b", 30), 4]), 0, 1)
    plan = plan_encoder_inputs(req, req.num_tokens, sched.encoder_cache, 100, False)
    assert plan.to_load == [0] and plan.blocked_on_space
    assert plan.num_new_tokens == req.mm_items[1].offset  # cut before the second load
    sched.add_request(req)
    while sched.has_unfinished_requests():
        fake_step(sched)
    assert sched.counters["encoder_store_loads"] == 2
    assert not sched.encoder_cache.referenced and sched.kv.pool.num_used_blocks == 0


def test_a_loaded_entry_is_a_cache_hit_for_the_next_request_in_the_step():
    sched = make_scheduler(budget=200)
    sched.add_request(with_stored(make_request("r1", [4, ("a", 20), 4]), 0))
    sched.add_request(make_request("r2", [6, ("a", 20), 4]))
    out = sched.schedule()
    assert out.scheduled_encoder_loads == {"r1": [0]} and not out.scheduled_encoder_inputs
    assert sched.counters["encoder_cache_hits"] == 1
