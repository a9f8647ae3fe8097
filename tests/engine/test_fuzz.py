"""Differential fuzz (issue 11): random workloads under stressed configs give the plain
engine's tokens, keep every invariant after every step and leak nothing. ``--fuzz-seeds N``
runs seeds 0..N-1 (default: a short range)."""

from __future__ import annotations

from collections import Counter

from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput
from tests.fuzz_harness import PlainOutputs, Workload, inject_faults, params, random_workload

MAX_STEPS = 4000
_plain = PlainOutputs()


def check_invariants(engine: LLMEngine) -> None:
    sched = engine.scheduler
    live = set(sched.requests)
    assert {r.req_id for r in sched.running} | {r.req_id for r in sched.waiting} == live
    assert len(sched.running) + len(sched.waiting) == len(live)
    assert len(sched.running) <= sched.max_num_seqs
    pool = sched.kv.pool
    held = Counter(b.block_id for blocks in sched.kv.req_blocks.values() for b in blocks)
    assert all(pool.blocks[i].ref_cnt == n for i, n in held.items())
    assert sum(b.ref_cnt for b in pool.blocks) == sum(held.values())
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)
    assert set(sched.kv.req_blocks) <= {r.req_id for r in sched.running}
    bs = sched.kv.block_size
    for request in sched.running:
        assert sched.kv.num_blocks_of(request.req_id) == -(-request.num_computed_tokens // bs)
    cache = sched.encoder_cache
    assert 0 <= cache.num_free and sum(cache.sizes.values()) == cache.capacity - cache.num_free
    assert set(cache.sizes) == set(cache.referenced) | set(cache.unreferenced)
    for request in sched.waiting:
        assert request.num_computed_tokens == 0 and request.req_id not in sched.kv.req_blocks
    for req_id, request in sched.requests.items():  # references are per occurrence in progress
        computed = request.num_computed_tokens
        in_progress = {it.key for it in request.mm_items if it.offset < computed < it.end}
        holding = {k for k, refs in cache.referenced.items() if req_id in refs}
        assert holding == in_progress, (req_id, holding, in_progress)
    worker = engine.runner.encoder
    assert set(cache.sizes) <= set(worker.embeddings)  # every entry was really encoded
    assert set(worker.embeddings) <= set(cache.sizes) | set(cache._freed)
    assert worker.num_gather_misses == 0


def run_workload(work: Workload) -> dict[str, object]:
    engine = LLMEngine.from_args(work.model, **work.engine_args)
    inject_faults(engine, work.fail_calls)
    pending = dict(enumerate(work.requests))
    ids: dict[str, int] = {}
    finished: dict[int, object] = {}
    aborted: set[int] = set()
    for step in range(MAX_STEPS):
        for idx, req in list(pending.items()):
            if req.arrival_step <= step:
                req_id = engine.add_request(PromptInput(req.prompt, req.images), params(req))
                ids[req_id] = idx
                del pending[idx]
        for req_id, idx in ids.items():
            req = work.requests[idx]
            if req.abort_step == step and idx not in finished and idx not in aborted:
                engine.abort_request([req_id])
                aborted.add(idx)
        if not pending and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                finished[ids[out.request_id]] = out
        check_invariants(engine)
    else:
        raise AssertionError(f"workload not finished after {MAX_STEPS} steps")
    metrics = engine.get_metrics()
    assert metrics["kv_blocks_used"] == 0 and metrics["encoder_cache_references"] == 0, metrics
    engine.step()  # hands the last ended requests and evictions to the worker
    assert not engine.runner.states and not engine.runner._parked_generators
    for idx, req in enumerate(work.requests):
        if idx in aborted and idx not in finished:
            continue
        out = finished[idx]
        reason = out.outputs[0].finish_reason
        if req.poisoned:
            assert reason == "error" and "rejects this image" in out.error, (idx, reason)
            continue
        assert reason == "length", (idx, reason, out.error)
        assert out.outputs[0].token_ids == _plain.get(work.model, req), (idx, work.engine_args)
    return metrics


def test_fuzz(fuzz_seed: int) -> None:
    run_workload(random_workload(fuzz_seed))
