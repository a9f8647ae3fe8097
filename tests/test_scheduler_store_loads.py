"""Encoder-store hits in the scheduler: a load takes cache space but no encoder budget."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmserve.core.encoder_scheduling import plan_encoder_inputs
from mmserve.core.outputs import ModelRunnerOutput
from tests.core_helpers import fake_step, make_request, make_scheduler
from tests.test_scheduler_property import check_invariants


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


STORED_IMAGES = {"a": 24, "b": 40, "c": 16}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(
        st.lists(
            st.one_of(
                st.integers(1, 20),
                st.tuples(st.sampled_from(sorted(STORED_IMAGES)), st.booleans()),
            ),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=6,
    ),
    budget=st.integers(8, 64),
    capacity=st.integers(40, 90),
)
def test_random_mixes_of_loads_and_encodes_keep_the_invariants_and_finish(
    prompts, budget, capacity
):
    sched = make_scheduler(budget=budget, encoder_budget=40, encoder_capacity=capacity,
                           num_blocks=64, max_num_seqs=3)  # fmt: skip
    for n, prompt in enumerate(prompts):
        layout = [(p[0], STORED_IMAGES[p[0]]) if isinstance(p, tuple) else p for p in prompt]
        request = make_request(f"r{n}", layout)
        stored = [i for i, p in enumerate(q for q in prompt if isinstance(q, tuple)) if p[1]]
        sched.add_request(with_stored(request, *stored))
    for _ in range(500):
        if not sched.has_unfinished_requests():
            break
        cached_before = set(sched.encoder_cache.sizes)
        out = sched.schedule()
        cached_before -= set(out.freed_encoder_keys)
        check_invariants(sched, out, cached_before)
        loaded = [
            sched.requests[r].mm_items[i].key
            for r, idx in out.scheduled_encoder_loads.items()
            for i in idx
        ]
        encoded = [
            sched.requests[r].mm_items[i].key
            for r, idx in out.scheduled_encoder_inputs.items()
            for i in idx
        ]
        assert len(loaded + encoded) == len(set(loaded + encoded))  # once per step, either way
        assert not set(loaded) & cached_before
        sampled = {
            r: 11
            for r in out.num_scheduled_tokens
            if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens
        }
        sched.update(out, ModelRunnerOutput(sampled_token_ids=sampled))
    assert not sched.has_unfinished_requests()  # progress: every request finished
    assert not sched.encoder_cache.referenced and sched.kv.pool.num_used_blocks == 0
