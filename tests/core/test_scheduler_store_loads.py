"""Encoder-store hits in the scheduler: a load takes cache space but no encoder budget."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmserve.core.encoder_scheduling import plan_encoder_inputs
from mmserve.core.outputs import ModelRunnerOutput, SchedulerOutput
from mmserve.core.scheduler import Scheduler
from tests.core.test_scheduler_property import check_invariants
from tests.support.scheduler import fake_step, make_request, make_scheduler, run_to_completion


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


def sources(sched: Scheduler, outs: list[SchedulerOutput]) -> tuple[list[str], list[str]]:
    """The item hashes the steps loaded and those they encoded, in step order."""
    loaded, encoded = [], []
    for out in outs:
        for plan, into in (
            (out.scheduled_encoder_loads, loaded),
            (out.scheduled_encoder_inputs, encoded),
        ):
            into += [
                f"{r}/{sched.requests[r].mm_items[i].hash}" for r, idx in plan.items() for i in idx
            ]
    return loaded, encoded


def test_a_load_drops_the_stored_tensor_of_every_occurrence_once_its_step_ran():
    sched = make_scheduler(budget=10)
    req = with_stored(make_request("r", [4, ("a", 20), 4, ("b", 20), 4, ("a", 20), 4]), 0, 1, 2)
    sched.add_request(req)
    out = sched.schedule()
    assert out.scheduled_encoder_loads == {"r": [0]}
    sched.rollback_step(out)  # a step the worker failed keeps the tensors to retry with
    assert all(item.stored is not None for item in req.mm_items)
    fake_step(sched)
    assert [item.stored is None for item in req.mm_items] == [True, False, True]
    run_to_completion(sched)
    assert all(item.stored is None for item in req.mm_items) and not req.may_hold_stored
    assert sched.counters["encoder_store_loads"] == 2  # a once, b once


def test_an_evicted_loaded_entry_the_request_needs_again_is_encoded():
    # room for one image: b's encode evicts a, whose second occurrence follows
    sched = make_scheduler(budget=200, encoder_capacity=20)
    req = with_stored(make_request("r", [4, ("a", 20), 4, ("b", 20), 4, ("a", 20), 4]), 0, 2)
    sched.add_request(req)
    outs = run_to_completion(sched)
    sched.requests["r"] = req  # finished: put back to read its items by index
    assert sources(sched, outs) == (["r/a"], ["r/b", "r/a"])


def test_a_preempted_request_encodes_what_it_loaded_before():
    sched = make_scheduler(num_blocks=4, budget=200, prefix_caching=False)
    sched.encoder_cache.retain_unreferenced = False  # the encoder cache off: a release evicts
    old = make_request("old", [16], max_tokens=40)
    new = with_stored(make_request("new", [4, ("a", 20), 4], max_tokens=10), 0)
    sched.add_request(old)
    sched.add_request(new)
    outs = run_to_completion(sched)
    assert sched.counters["num_preemptions"] > 0
    sched.requests["new"] = new
    assert sources(sched, outs) == (["new/a"], ["new/a"])


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
        for request in sched.requests.values():  # nothing reached holds its stored tensor
            reached = {i.key for i in request.mm_items if i.offset < request.num_computed_tokens}
            assert all(i.stored is None for i in request.mm_items if i.key in reached)
    assert not sched.has_unfinished_requests()  # progress: every request finished
    assert not sched.encoder_cache.referenced and sched.kv.pool.num_used_blocks == 0
