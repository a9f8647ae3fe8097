"""The scheduler's image walk inside chunked prefill, with fake requests (no tensors)."""

from __future__ import annotations

from mmserve.request import RequestStatus
from tests.support.scheduler import (
    assert_all_free,
    fake_step,
    make_request,
    make_scheduler,
    run_to_completion,
)


def test_image_split_across_chunks_encoded_once_and_released_when_in_kv():
    sched = make_scheduler(budget=32)
    req = make_request("r", [10, ("a", 40), 10])
    sched.add_request(req)
    out1 = fake_step(sched)
    assert out1.num_scheduled_tokens == {"r": 32}
    assert out1.scheduled_encoder_inputs == {"r": [0]}
    assert sched.encoder_cache.is_referenced_by("a:40", "r")
    out2 = fake_step(sched)
    assert out2.num_scheduled_tokens == {"r": 28} and not out2.scheduled_encoder_inputs
    assert not sched.encoder_cache.is_referenced_by("a:40", "r")  # all 40 tokens are in KV now
    assert "a:40" in sched.encoder_cache.unreferenced  # but it stays cached for others
    run_to_completion(sched)
    assert_all_free(sched)


def test_two_requests_needing_the_same_new_image_encode_it_once():
    sched = make_scheduler(budget=200)
    sched.add_request(make_request("r1", [5, ("a", 40), 5]))
    sched.add_request(make_request("r2", [7, ("a", 40), 3]))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"r1": 50, "r2": 50}
    assert out.scheduled_encoder_inputs == {"r1": [0]}
    assert sched.counters["encoder_cache_hits"] == 1
    assert sched.counters["encoder_cache_misses"] == 1
    run_to_completion(sched)
    assert_all_free(sched)


def test_encoder_budget_short_shrinks_chunk_to_end_before_the_image():
    sched = make_scheduler(budget=200, encoder_budget=40, encoder_capacity=100)
    sched.add_request(make_request("r", [5, ("a", 30), 5, ("b", 30), 5]))
    out1 = fake_step(sched)
    assert out1.num_scheduled_tokens == {"r": 40}  # stops right before image b
    assert out1.scheduled_encoder_inputs == {"r": [0]}
    out2 = fake_step(sched)
    assert out2.num_scheduled_tokens == {"r": 35}
    assert out2.scheduled_encoder_inputs == {"r": [1]}
    run_to_completion(sched)
    assert_all_free(sched)


def test_disable_chunked_mm_input_never_cuts_an_image():
    sched = make_scheduler(budget=45, disable_chunked_mm_input=True)
    sched.add_request(make_request("r", [10, ("a", 40), 10]))
    assert fake_step(sched).num_scheduled_tokens == {"r": 10}
    assert fake_step(sched).num_scheduled_tokens == {"r": 45}


def test_prefix_hit_inside_an_evicted_image_waits_with_zero_tokens():
    sched = make_scheduler(budget=30, encoder_budget=40, encoder_capacity=40)
    sched.add_request(make_request("r1", [("a", 40), 2]))
    run_to_completion(sched)  # a's KV blocks and embeddings stay cached (unreferenced)
    sched.add_request(make_request("r2", [("b", 40), 2]))
    out = fake_step(sched)  # r2 starts image b, evicting a from the encoder cache
    assert out.freed_encoder_keys == ["a:40"] and out.num_scheduled_tokens == {"r2": 30}
    r3 = make_request("r3", [("a", 40), 2])
    sched.add_request(r3)
    out = fake_step(sched)
    # r3's prefix hit (32 tokens) ends inside image a, which is gone and cannot be encoded
    # while r2 still holds b: r3 gets no tokens this step (never a negative count).
    assert out.num_scheduled_tokens == {"r2": 12}
    assert r3.status == RequestStatus.WAITING and r3.num_computed_tokens == 0
    out = fake_step(sched)
    assert out.num_scheduled_tokens["r3"] == 10  # 42 - 32 cached tokens
    assert out.scheduled_encoder_inputs == {"r3": [0]}  # re-encoded once b was released
    assert r3.num_cached_tokens == 32
    run_to_completion(sched)
    assert_all_free(sched)


def test_prefix_hit_covering_the_image_needs_no_encoder_work():
    sched = make_scheduler(budget=100)
    sched.add_request(make_request("r1", [4, ("a", 20), 30]))
    run_to_completion(sched)
    sched.encoder_cache.allocate("z", "other", 100 - 20)  # forces eviction of a
    sched.encoder_cache.release("z", "other")
    sched.add_request(make_request("r2", [4, ("a", 20), 30]))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"r2": 54 - 48} and not out.scheduled_encoder_inputs


def test_preemption_frees_blocks_and_encoder_refs_then_recomputes():
    sched = make_scheduler(num_blocks=8, budget=200, encoder_capacity=200, encoder_budget=200)
    sched.add_request(make_request("r1", [8, ("a", 40), 9], max_tokens=20))  # 57 tokens
    sched.add_request(make_request("r2", [8, ("b", 40), 9], max_tokens=20))
    outs = run_to_completion(sched)
    assert sched.counters["num_preemptions"] > 0
    assert all(n >= 1 for out in outs for n in out.num_scheduled_tokens.values())
    assert_all_free(sched)


def test_abort_releases_everything():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("r1", [4, ("a", 40), 4]))
    fake_step(sched)
    assert sched.encoder_cache.is_referenced_by("a:40", "r1")
    sched.finish_requests(["r1"], RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert out.finished_req_ids == {"r1"} and out.is_empty
    assert_all_free(sched)
