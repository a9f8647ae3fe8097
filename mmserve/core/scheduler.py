"""Continuous batching with chunked prefill, encoder scheduling and preemption."""

from __future__ import annotations

from collections import Counter, deque

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.encoder_scheduling import (
    EncoderPlan,
    commit_encoder_plan,
    plan_encoder_inputs,
    release_encoded_inputs,
)
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.outputs import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from mmserve.request import Request, RequestStatus


class Scheduler:
    """Decides, each step, which tokens of which requests run and which images get encoded.

    Invariants:
    - a live request is in exactly one of ``waiting`` (FCFS, preempted ones first) or
      ``running``; ``len(running) <= max_num_seqs``;
    - per step: scheduled tokens <= max_num_batched_tokens, every scheduled count is >= 1 (a
      request that cannot progress is left out, never given 0 or a negative count), encoder
      work <= the encoder compute budget, and an image hash is encoded at most once;
    - a request references an image in the encoder cache from the step its chunk first overlaps
      the image until the image's last token is computed, or until it finishes, is aborted or
      preempted (preemption frees its KV blocks and encoder references; it recomputes later);
    - when no request is live, every KV block and every encoder-cache reference is free.
    """

    def __init__(
        self,
        kv_manager: KVCacheManager,
        encoder_cache: EncoderCacheManager,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        encoder_compute_budget: int,
        disable_chunked_mm_input: bool = False,
    ) -> None:
        self.kv = kv_manager
        self.encoder_cache = encoder_cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.encoder_compute_budget = encoder_compute_budget
        self.disable_chunked_mm_input = disable_chunked_mm_input
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._worker_knows: set[str] = set()
        self._worker_parked: set[str] = set()  # preempted: the worker keeps only their RNG
        self._ended_since_last_step: set[str] = set()
        self._preempted_since_last_step: set[str] = set()
        self.counters: Counter[str] = Counter()

    # ---- request lifecycle -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        self.requests[request.req_id] = request
        self.kv.update_block_hashes(request)
        self.waiting.append(request)

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> None:
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is not None:
                self._finish(request, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _release_resources(self, request: Request) -> None:
        self.kv.free(request)
        self.encoder_cache.release_all(request.req_id, [item.hash for item in request.mm_items])
        if request.req_id in self._worker_knows:
            self._worker_knows.discard(request.req_id)
            self._ended_since_last_step.add(request.req_id)
        elif request.req_id in self._worker_parked:
            self._worker_parked.discard(request.req_id)
            self._ended_since_last_step.add(request.req_id)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._release_resources(request)
        request.status = status
        del self.requests[request.req_id]

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        self.encoder_cache.release_all(request.req_id, [item.hash for item in request.mm_items])
        if request.req_id in self._worker_knows:
            self._worker_knows.discard(request.req_id)
            self._worker_parked.add(request.req_id)
            self._preempted_since_last_step.add(request.req_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self.counters["num_preemptions"] += 1

    # ---- scheduling --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.kv.begin_step()
        out = SchedulerOutput()
        self._token_budget = self.max_num_batched_tokens
        self._encoder_budget = self.encoder_compute_budget
        preempted = self._schedule_running(out)
        if not preempted:
            self._schedule_waiting(out)
        out.freed_encoder_hashes = self.encoder_cache.take_freed()
        out.finished_req_ids = self._ended_since_last_step
        out.preempted_req_ids = self._preempted_since_last_step
        self._ended_since_last_step = set()
        self._preempted_since_last_step = set()
        return out

    def _plan(self, request: Request) -> EncoderPlan:
        num_new = min(request.num_tokens - request.num_computed_tokens, self._token_budget)
        return plan_encoder_inputs(
            request,
            num_new,
            self.encoder_cache,
            self._encoder_budget,
            self.disable_chunked_mm_input,
        )

    def _schedule_running(self, out: SchedulerOutput) -> bool:
        preempted = False
        idx = 0
        while idx < len(self.running) and self._token_budget > 0:
            request = self.running[idx]
            plan = self._plan(request)
            if plan.num_new_tokens == 0:
                idx += 1
                continue
            new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens)
            while new_block_ids is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
                new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens)
            if new_block_ids is None:
                break
            self._commit(request, plan, new_block_ids, out)
            idx += 1
        return preempted

    def _schedule_waiting(self, out: SchedulerOutput) -> None:
        while self.waiting and self._token_budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            request.num_computed_tokens = num_hit
            plan = self._plan(request)
            new_block_ids = None
            if plan.num_new_tokens > 0:
                new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens, hit_blocks)
            if new_block_ids is None:
                request.num_computed_tokens = 0
                break
            if request.status == RequestStatus.WAITING:  # first admission, not a resume
                request.num_cached_tokens = num_hit
                self.kv.record_prefix_query(request.num_tokens, num_hit)
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            self._commit(request, plan, new_block_ids, out)

    def _commit(
        self, request: Request, plan: EncoderPlan, new_block_ids: list[int], out: SchedulerOutput
    ) -> None:
        hits, saved = commit_encoder_plan(request, plan, self.encoder_cache)
        self.counters["encoder_cache_hits"] += hits
        self.counters["encoder_embeddings_from_cache"] += saved
        self.counters["encoder_cache_misses"] += len(plan.to_encode)
        self._encoder_budget -= plan.num_embeddings_to_encode
        if plan.to_encode:
            out.scheduled_encoder_inputs[request.req_id] = plan.to_encode
        if request.req_id in self._worker_knows:
            out.cached_requests.append(
                CachedRequestData(request.req_id, new_block_ids, request.num_computed_tokens)
            )
        else:
            self._worker_knows.add(request.req_id)
            self._worker_parked.discard(request.req_id)
            out.new_requests.append(
                NewRequestData(
                    req_id=request.req_id,
                    token_ids=list(request.all_token_ids),
                    mm_items=request.mm_items,
                    sampling_params=request.sampling_params,
                    block_ids=self.kv.block_ids(request.req_id),
                    num_computed_tokens=request.num_computed_tokens,
                )
            )
        out.num_scheduled_tokens[request.req_id] = plan.num_new_tokens
        request.num_computed_tokens += plan.num_new_tokens
        self._token_budget -= plan.num_new_tokens

    def rollback_step(self, sched: SchedulerOutput) -> None:
        """The worker failed to run ``sched``: forget its prefix-cache registrations and abort
        the requests it scheduled (their KV is incomplete)."""
        self.kv.rollback_step()
        self.finish_requests(list(sched.num_scheduled_tokens), RequestStatus.FINISHED_ABORTED)

    # ---- results -----------------------------------------------------------------------
    def update(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Apply a step's results. Returns the requests that got a token (finished ones too)."""
        updated = []
        for req_id in sched.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None:
                continue  # aborted while the step ran
            release_encoded_inputs(request, self.encoder_cache)
            token = result.sampled_token_ids.get(req_id)
            if token is None:
                continue  # a prefill chunk that did not reach the end
            request.append_output_token(token)
            self.kv.update_block_hashes(request)
            self.counters["generation_tokens"] += 1
            status = request.check_stop()
            if status is not None:
                self._finish(request, status)
            updated.append(request)
        return updated
