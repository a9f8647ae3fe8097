"""Fake requests and a fake worker for testing core/ without tensors."""

from __future__ import annotations

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.outputs import ModelRunnerOutput, SchedulerOutput
from mmserve.core.scheduler import Scheduler
from mmserve.inputs import MultiModalItem
from mmserve.request import Request
from mmserve.sampling_params import SamplingParams

IMAGE_TOKEN = 9


def make_request(
    req_id: str,
    layout: list[int | tuple[str, int]],
    max_tokens: int = 2,
    cache_salt: str | None = None,
) -> Request:
    """layout: ints are text lengths, (hash, n) tuples are images of n embeddings."""
    ids: list[int] = []
    items = []
    for part in layout:
        if isinstance(part, tuple):
            mm_hash, n = part
            items.append(MultiModalItem(mm_hash, len(ids), n))
            ids.extend([IMAGE_TOKEN] * n)
        else:
            ids.extend(100 + (len(ids) + i) % 50 for i in range(part))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Request(req_id, ids, params, items, cache_salt=cache_salt)


def make_scheduler(
    *,
    num_blocks: int = 1000,
    block_size: int = 16,
    budget: int = 64,
    max_num_seqs: int = 8,
    encoder_budget: int = 100,
    encoder_capacity: int = 100,
    prefix_caching: bool = True,
    disable_chunked_mm_input: bool = False,
) -> Scheduler:
    return Scheduler(
        KVCacheManager(num_blocks, block_size, prefix_caching, hash_seed=0),
        EncoderCacheManager(encoder_capacity),
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        encoder_compute_budget=encoder_budget,
        disable_chunked_mm_input=disable_chunked_mm_input,
    )


def fake_step(scheduler: Scheduler, token: int = 7) -> SchedulerOutput:
    """schedule() + a worker that 'samples' ``token`` for every request that reached its end."""
    out = scheduler.schedule()
    sampled = {
        req_id: token
        for req_id in out.num_scheduled_tokens
        if scheduler.requests[req_id].num_computed_tokens == scheduler.requests[req_id].num_tokens
    }
    scheduler.update(out, ModelRunnerOutput(sampled_token_ids=sampled))
    return out


def run_to_completion(scheduler: Scheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return outs
        outs.append(fake_step(scheduler))
    raise AssertionError("scheduler did not finish")


def assert_all_free(scheduler: Scheduler) -> None:
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert not scheduler.encoder_cache.referenced
    assert not scheduler.kv.req_blocks
