"""Continuous batching with chunked prefill, encoder scheduling and preemption."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.encoder_scheduling import (
    EncoderPlan,
    commit_encoder_plan,
    drop_reached_stored,
    note_prefix_hits,
    note_worker_encodes,
    plan_encoder_inputs,
    release_finished_occurrences,
    settle_store_waits,
)
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.outputs import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from mmserve.core.request_queues import RequestQueues
from mmserve.core.step_budget import StepBudget
from mmserve.core.step_journal import RequestCommit, StepJournal
from mmserve.request import Request, RequestStatus


class SchedulingError(RuntimeError):
    """``schedule()`` raised while planning ``request``; the whole step was rolled back."""

    def __init__(self, request: Request | None, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.request = request


class Scheduler(RequestQueues):
    """Decides, each step, which tokens of which requests run and which images get encoded.

    Invariants:
    - ``waiting`` is FCFS (preempted ones first) and ``running`` in admission order (a live
      request is in exactly one: ``RequestQueues``); ``len(running) <= max_num_seqs``;
    - per step: scheduled tokens <= max_num_batched_tokens, every scheduled count is >= 1 (a
      request that cannot progress is left out, never given 0 or a negative count), encoder
      work <= the encoder compute budget (``StepBudget``), and an item key is encoded or
      loaded at most once (a load, an item the encoder store returned at admission, takes
      cache space but no encoder budget); an item another replica is encoding is neither: its
      request runs up to it, or, waiting, is passed over (keeping its place) for the next;
    - a request holds an item's store embedding (``MultiModalItem.stored``, a host tensor)
      only until a step that ran reached the item; an entry it needs again after an eviction
      (preemption, a later occurrence of the image) is encoded, never loaded twice;
    - a request references an item *occurrence* from the step that schedules its first token
      until its last token is computed (or the request ends or is preempted); at a step
      boundary a request therefore holds at most the one entry its computed position is in;
    - encoder plans are computed after the KV allocation they go with, so a preemption that
      releases (and, with the encoder cache off, evicts) an entry is seen by the plan;
    - ``schedule()`` is transactional (``StepJournal``): if it raises, every reference, block
      and request field it changed is restored and ``SchedulingError`` names the request being
      planned; ``rollback_step`` undoes a scheduled step the worker failed to run;
    - when no request is live, every KV block and every encoder-cache reference is free.

    Progress: given the engine's admission checks, every admitted request finishes; the
    argument, and the safety net should a bug break it, are in ``core/progress.py``.
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
        super().__init__(kv_manager, encoder_cache)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.encoder_compute_budget = encoder_compute_budget
        self.disable_chunked_mm_input = disable_chunked_mm_input
        self._journal = StepJournal()
        self._budget = StepBudget(max_num_batched_tokens, encoder_compute_budget)
        self.counters: Counter[str] = Counter()

    # ---- preemption --------------------------------------------------------------------
    def _preempt(self, request: Request) -> None:
        self._journal.forget(request)
        self._release_resources(request)
        self.worker.preempted(request.req_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self.counters["num_preemptions"] += 1

    # ---- scheduling --------------------------------------------------------------------
    def schedule(self, only: set[str] | None = None) -> SchedulerOutput:
        """Plan and commit one step. ``only``: consider just these request ids and preempt
        nobody (the engine's retry of a failed step's requests in parts)."""
        self.kv.begin_step()
        self._journal = StepJournal.begin(self.counters, self.kv)
        out = SchedulerOutput()
        self._budget = StepBudget(self.max_num_batched_tokens, self.encoder_compute_budget)
        try:
            preempted = self._schedule_running(out, only)
            if not preempted:
                self._schedule_waiting(out, only)
        except Exception as exc:
            culprit = self._journal.current
            self._undo()
            raise SchedulingError(culprit, exc) from exc
        self._journal.current = None
        self._journal.output = out
        out.freed_encoder_keys = self.encoder_cache.take_freed()
        out.finished_req_ids, out.preempted_req_ids = self.worker.take_changes()
        return out

    @property
    def held_for_store(self) -> int:
        """Requests of the last step held at an item another replica is encoding."""
        return self._budget.held_for_store

    def _plan(self, request: Request) -> EncoderPlan:
        settle_store_waits(request)
        num_new = min(request.num_tokens - request.num_computed_tokens, self._budget.tokens)
        return plan_encoder_inputs(
            request,
            num_new,
            self.encoder_cache,
            self._budget.encoder_embeddings,
            self.disable_chunked_mm_input,
            may_take_space=not self._budget.encoder_space_reserved,
        )

    def _schedule_running(self, out: SchedulerOutput, only: set[str] | None) -> bool:
        preempted = False
        idx = 0
        while idx < len(self.running) and self._budget.tokens > 0:
            request = self.running[idx]
            idx += 1
            if only is not None and request.req_id not in only:
                continue
            self._journal.current = request
            entry = self._journal.record(request, self.kv)
            plan = self._plan(request)
            new_block_ids = None
            while plan.num_new_tokens > 0:
                new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens)
                if new_block_ids is not None or only is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return preempted
                plan = self._plan(request)  # the victim's release may have evicted a planned hit
            self._budget.note_refusal(plan)
            if new_block_ids is not None:
                self._commit(entry, plan, new_block_ids, out)
        return preempted

    def _schedule_waiting(self, out: SchedulerOutput, only: set[str] | None) -> None:
        for request in self._waiting_candidates(only):
            if self._budget.tokens <= 0 or len(self.running) >= self.max_num_seqs:
                return
            if request.waits_for_leader:  # FCFS: its leader is ahead and progressing
                return
            self._journal.current = request
            entry = self._journal.record(request, self.kv)
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            request.num_computed_tokens = num_hit
            plan = self._plan(request)
            self._budget.note_refusal(plan)
            new_block_ids = None
            if plan.num_new_tokens > 0:
                new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens, hit_blocks)
            if new_block_ids is None:
                request.num_computed_tokens = entry.prev_num_computed_tokens
                if plan.awaits_store and plan.num_new_tokens == 0:
                    continue  # another replica encodes its next item: the next may go
                return
            if request.status == RequestStatus.WAITING:  # first admission, not a resume
                request.num_cached_tokens = num_hit
                self.kv.record_prefix_query(request.num_tokens, num_hit)
            note_prefix_hits(request, num_hit, entry.encoder)
            entry.admitted = True
            entry.waiting_index = self.waiting.index(request)
            del self.waiting[entry.waiting_index]
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            self._commit(entry, plan, new_block_ids, out)

    def _waiting_candidates(self, only: set[str] | None) -> Iterator[Request]:
        """FCFS: the head of ``waiting`` until one is refused (admitted ones leave it)."""
        if only is not None:
            yield from [request for request in self.waiting if request.req_id in only]
            return
        idx = 0
        while idx < len(self.waiting):
            request = self.waiting[idx]
            yield request
            idx += idx < len(self.waiting) and self.waiting[idx] is request

    def _commit(
        self,
        entry: RequestCommit,
        plan: EncoderPlan,
        new_block_ids: list[int],
        out: SchedulerOutput,
    ) -> None:
        request = entry.request
        commit_encoder_plan(request, plan, self.encoder_cache, entry.encoder)
        self.counters["encoder_cache_hits"] += entry.encoder.hits
        self.counters["encoder_embeddings_from_cache"] += entry.encoder.embeddings_saved
        self.counters["encoder_cache_misses"] += len(plan.to_encode)
        self._budget.charge(plan)
        if plan.to_encode:
            out.scheduled_encoder_inputs[request.req_id] = plan.to_encode
        if plan.to_load:
            self.counters["encoder_store_loads"] += len(plan.to_load)
            out.scheduled_encoder_loads[request.req_id] = plan.to_load
        if self.worker.knows(request.req_id):
            out.cached_requests.append(
                CachedRequestData(request.req_id, new_block_ids, request.num_computed_tokens)
            )
        else:
            entry.told_worker = True
            entry.was_parked = self.worker.send(request.req_id)
            block_ids = self.kv.block_ids(request.req_id)
            out.new_requests.append(NewRequestData.of(request, block_ids))
        out.num_scheduled_tokens[request.req_id] = plan.num_new_tokens
        request.num_computed_tokens += plan.num_new_tokens

    def _undo(self) -> None:
        """Restore what the last ``schedule()`` committed (see ``StepJournal``)."""
        self._journal.undo(self.kv, self.encoder_cache, self.worker, self.running, self.waiting)
        self.counters = Counter(self._journal.counters)
        self._journal = StepJournal()

    def rollback_step(self, sched: SchedulerOutput) -> None:
        """The worker failed to run ``sched`` (the last step scheduled): undo it whole. Its
        requests are back where they were, to be retried; ``sched`` must not be updated."""
        if self._journal.output is not sched:
            raise ValueError("rollback_step: only the last scheduled, not yet updated step")
        self._undo()

    # ---- results -----------------------------------------------------------------------
    def update(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Apply a step's results. Returns the requests that got a token (finished ones too)."""
        self._journal = StepJournal()  # the step ran: nothing to roll back any more
        updated = []
        for req_id, num_scheduled in sched.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue  # aborted while the step ran
            release_finished_occurrences(request, num_scheduled, self.encoder_cache)
            note_worker_encodes(request, num_scheduled, result.encoded_instead)
            drop_reached_stored(request)
            prompt_logprobs = result.prompt_logprobs.get(req_id)
            if prompt_logprobs is not None:
                request.add_prompt_logprobs(*prompt_logprobs)
            token = result.sampled_token_ids.get(req_id)
            if token is None:
                continue  # a prefill chunk that did not reach the end
            request.append_output_token(token, result.logprobs.get(req_id))
            self.kv.update_block_hashes(request)
            self.counters["generation_tokens"] += 1
            status = request.check_stop()
            if status is not None:
                self._finish(request, status)
            updated.append(request)
        return updated
