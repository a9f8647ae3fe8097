"""Property test: random admit / step / abort sequences keep every scheduler invariant."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmserve.core.outputs import ModelRunnerOutput
from mmserve.request import RequestStatus
from tests.support.scheduler import assert_all_free, make_request, make_scheduler

IMAGES = {"a": 24, "b": 40, "c": 16, "d": 30}

layout_part = st.one_of(
    st.integers(1, 30), st.sampled_from(sorted(IMAGES)).map(lambda h: (h, IMAGES[h]))
)
action = st.one_of(
    st.tuples(st.just("add"), st.lists(layout_part, min_size=1, max_size=4), st.integers(1, 6)),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 50)),
)


def check_invariants(sched, out, encoded_before: set[str]) -> None:
    assert len(sched.running) <= sched.max_num_seqs
    assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
    assert all(n >= 1 for n in out.num_scheduled_tokens.values())
    encoded = [
        sched.requests[r].mm_items[i]
        for r, idx in out.scheduled_encoder_inputs.items()
        for i in idx
    ]
    assert sum(item.length for item in encoded) <= sched.encoder_compute_budget
    hashes = [item.key for item in encoded]
    assert len(hashes) == len(set(hashes))  # each image encoded at most once per step
    assert not set(hashes) & encoded_before  # never encode what is still cached
    cache = sched.encoder_cache
    assert 0 <= cache.num_free <= cache.capacity
    assert sum(cache.sizes.values()) == cache.capacity - cache.num_free
    assert set(cache.sizes) == set(cache.referenced) | set(cache.unreferenced)
    for mm_hash, refs in cache.referenced.items():
        assert refs and refs <= set(sched.requests)
        for req_id in refs:
            assert any(it.key == mm_hash for it in sched.requests[req_id].mm_items)
    pool = sched.kv.pool
    held = Counter(b.block_id for blocks in sched.kv.req_blocks.values() for b in blocks)
    assert all(pool.blocks[i].ref_cnt == n for i, n in held.items())
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)


def step(sched) -> None:
    encoded_before = set(sched.encoder_cache.sizes)
    out = sched.schedule()
    check_invariants(sched, out, encoded_before - set(out.freed_encoder_keys))
    sampled = {
        r: 11
        for r in out.num_scheduled_tokens
        if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens
    }
    sched.update(out, ModelRunnerOutput(sampled_token_ids=sampled))
    for req_id, request in sched.requests.items():  # references are per occurrence in progress
        computed = request.num_computed_tokens
        in_progress = {it.key for it in request.mm_items if it.offset < computed < it.end}
        held = {k for k, refs in sched.encoder_cache.referenced.items() if req_id in refs}
        assert held == in_progress, (req_id, held, in_progress)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=st.lists(action, max_size=40),
    budget=st.integers(8, 64),
    num_blocks=st.integers(12, 40),
    max_num_seqs=st.integers(1, 4),
    prefix_caching=st.booleans(),
)
def test_random_workloads_keep_invariants_and_free_everything(
    actions, budget, num_blocks, max_num_seqs, prefix_caching
):
    sched = make_scheduler(
        num_blocks=num_blocks,
        block_size=4,
        budget=budget,
        max_num_seqs=max_num_seqs,
        encoder_budget=40,
        encoder_capacity=64,
        prefix_caching=prefix_caching,
    )
    ids = 0
    for act in actions:
        if act[0] == "add":
            req = make_request(f"r{ids}", act[1], max_tokens=act[2])
            ids += 1
            if req.num_tokens + act[2] <= num_blocks * 4:  # the engine rejects larger ones
                sched.add_request(req)
        elif act[0] == "step":
            step(sched)
        elif sched.requests:
            victim = sorted(sched.requests)[act[1] % len(sched.requests)]
            sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        step(sched)
    assert not sched.has_unfinished_requests(), "scheduler stalled"
    sched.schedule()
    assert_all_free(sched)
