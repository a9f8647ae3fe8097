"""Continuous batching with chunked prefill, encoder scheduling and preemption."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.encoder_scheduling import (
    EncoderCommit,
    EncoderPlan,
    commit_encoder_plan,
    drop_reached_stored,
    note_prefix_hits,
    plan_encoder_inputs,
    release_finished_occurrences,
    undo_encoder_commit,
)
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.outputs import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from mmserve.core.step_journal import RequestCommit, StepJournal
from mmserve.core.worker_view import WorkerView
from mmserve.request import Request, RequestStatus


class SchedulingError(RuntimeError):
    """``schedule()`` raised while planning ``request``; the whole step was rolled back."""

    def __init__(self, request: Request | None, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.request = request


class Scheduler:
    """Decides, each step, which tokens of which requests run and which images get encoded.

    Invariants:
    - a live request is in exactly one of ``waiting`` (FCFS, preempted ones first) or
      ``running`` (admission order); ``len(running) <= max_num_seqs``;
    - per step: scheduled tokens <= max_num_batched_tokens, every scheduled count is >= 1 (a
      request that cannot progress is left out, never given 0 or a negative count), encoder
      work <= the encoder compute budget, and an item key is encoded or loaded at most once (a
      load, an item the encoder store returned at admission, takes cache space but no
      encoder budget);
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

    Progress guarantee: if every item fits the encoder cache and the per-step encoder budget,
    ``max_model_len`` fits the KV cache and every prompt is shorter than ``max_model_len`` (the
    engine validates all three), every admitted request finishes. Argument: the oldest running
    request H is scheduled first with the whole token and encoder budget. KV: H preempts newer
    requests until its blocks fit, and it fits alone. Encoder: the entries H can find occupied
    are held only by occurrences in progress, which need no new encoder work and finish within
    a bounded number of steps; once H is refused cache space, no later request of that step
    may take any (``EncoderPlan.blocked_on_space``), so those occurrences drain and H gets the
    space. Hence H gains >= 1 token within bounded steps, finishes, and the next oldest becomes
    H; waiting requests are admitted FCFS as running ones finish. Encoder-store lookups never
    hold a request back: they end (hit, miss or deadline) before it reaches the scheduler, and
    a load needs only the cache space an encode of the same item would. A child of an
    ``n > 1`` request that waits for its leader's prefill (``Request.waits_for_leader``) holds
    the queue only while the leader, which is ahead of it, runs. ``ProgressMonitor`` is the
    safety net should a bug break this: it fails the stuck request only.
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
        self.worker = WorkerView()
        self._journal = StepJournal()
        self._space_reserved = False
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

    def head(self) -> Request | None:
        """The request the scheduler serves first: the oldest running, else the next waiting."""
        if self.running:
            return self.running[0]
        return self.waiting[0] if self.waiting else None

    def _release_resources(self, request: Request) -> None:
        self.kv.free(request)
        self.encoder_cache.release_all(request.req_id, [item.key for item in request.mm_items])
        self.worker.ended(request.req_id)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._release_resources(request)
        request.status = status
        del self.requests[request.req_id]

    def _preempt(self, request: Request) -> None:
        journal = self._journal  # its state is final: a rollback must not restore it
        journal.commits = [entry for entry in journal.commits if entry.request is not request]
        self.kv.free(request)
        self.encoder_cache.release_all(request.req_id, [item.key for item in request.mm_items])
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
        self._journal = StepJournal(
            counters=dict(self.counters),
            prefix_counters=(self.kv.prefix_cache_queries, self.kv.prefix_cache_hits),
        )
        out = SchedulerOutput()
        self._token_budget = self.max_num_batched_tokens
        self._encoder_budget = self.encoder_compute_budget
        self._space_reserved = False
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

    def _plan(self, request: Request) -> EncoderPlan:
        num_new = min(request.num_tokens - request.num_computed_tokens, self._token_budget)
        return plan_encoder_inputs(
            request,
            num_new,
            self.encoder_cache,
            self._encoder_budget,
            self.disable_chunked_mm_input,
            may_take_space=not self._space_reserved,
        )

    def _schedule_running(self, out: SchedulerOutput, only: set[str] | None) -> bool:
        preempted = False
        idx = 0
        while idx < len(self.running) and self._token_budget > 0:
            request = self.running[idx]
            idx += 1
            if only is not None and request.req_id not in only:
                continue
            self._journal.current = request
            entry = self._journal_entry(request)
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
            self._space_reserved |= plan.blocked_on_space
            if new_block_ids is not None:
                self._commit(entry, plan, new_block_ids, out)
        return preempted

    def _schedule_waiting(self, out: SchedulerOutput, only: set[str] | None) -> None:
        for request in self._waiting_candidates(only):
            if self._token_budget <= 0 or len(self.running) >= self.max_num_seqs:
                return
            if request.waits_for_leader:  # FCFS: its leader is ahead and progressing
                return
            self._journal.current = request
            entry = self._journal_entry(request)
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            request.num_computed_tokens = num_hit
            plan = self._plan(request)
            self._space_reserved |= plan.blocked_on_space
            new_block_ids = None
            if plan.num_new_tokens > 0:
                new_block_ids = self.kv.allocate_slots(request, plan.num_new_tokens, hit_blocks)
            if new_block_ids is None:
                request.num_computed_tokens = entry.prev_num_computed_tokens
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
        """FCFS: the head of ``waiting`` until one is refused (an admitted one leaves it)."""
        if only is not None:
            yield from [request for request in self.waiting if request.req_id in only]
            return
        while self.waiting:
            yield self.waiting[0]

    def _journal_entry(self, request: Request) -> RequestCommit:
        entry = RequestCommit(
            request,
            EncoderCommit(),
            False,
            request.status,
            request.num_computed_tokens,
            request.num_cached_tokens,
            self.kv.num_blocks_of(request.req_id),
        )
        self._journal.commits.append(entry)
        return entry

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
        self._encoder_budget -= plan.num_embeddings_to_encode
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
            out.new_requests.append(
                NewRequestData(
                    req_id=request.req_id,
                    token_ids=list(request.all_token_ids),
                    mm_items=request.mm_items,
                    sampling_params=request.sampling_params,
                    block_ids=self.kv.block_ids(request.req_id),
                    num_computed_tokens=request.num_computed_tokens,
                    num_prompt_tokens=request.num_prompt_tokens,
                )
            )
        out.num_scheduled_tokens[request.req_id] = plan.num_new_tokens
        request.num_computed_tokens += plan.num_new_tokens
        self._token_budget -= plan.num_new_tokens

    def _undo(self) -> None:
        """Restore what the last ``schedule()`` committed (see ``StepJournal``)."""
        journal = self._journal
        self.kv.rollback_step()
        for entry in reversed(journal.commits):
            request = entry.request
            undo_encoder_commit(request, entry.encoder, self.encoder_cache)
            self.kv.truncate(request, entry.prev_num_blocks)
            request.num_computed_tokens = entry.prev_num_computed_tokens
            request.num_cached_tokens = entry.prev_num_cached_tokens
            if entry.admitted:
                self.running.remove(request)
                request.status = entry.prev_status
                self.waiting.insert(entry.waiting_index, request)
            if entry.told_worker:
                self.worker.unsend(request.req_id, entry.was_parked)
        self.counters = Counter(journal.counters)
        self.kv.prefix_cache_queries, self.kv.prefix_cache_hits = journal.prefix_counters
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
