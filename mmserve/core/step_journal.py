"""The undo log that makes ``Scheduler.schedule()`` transactional, and its undo."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.encoder_scheduling import EncoderCommit, undo_encoder_commit
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.outputs import SchedulerOutput
from mmserve.core.worker_view import WorkerView
from mmserve.request import Request, RequestStatus


@dataclass
class RequestCommit:
    """What committing one request's chunk changed, with the values it replaced."""

    request: Request
    encoder: EncoderCommit
    admitted: bool  # moved from ``waiting`` to ``running`` by this step
    prev_status: RequestStatus
    prev_num_computed_tokens: int
    prev_num_cached_tokens: int
    prev_num_blocks: int
    told_worker: bool = False  # the request became known to the worker by this step
    was_parked: bool = False
    waiting_index: int = 0  # where it stood in ``waiting`` before being admitted


@dataclass
class StepJournal:
    """Everything one ``schedule()`` call committed, in commit order.

    Invariant: ``undo`` (the entries in reverse order) restores every request's status, queue
    position, computed tokens, KV blocks and encoder references, and the prefix-cache
    counters; the caller restores its own ``counters`` from the copy kept here. Preemptions are
    not undone (``forget``): a preempted request is in a valid state (waiting, nothing held)
    and recomputes later. Cache *content* the step evicted (free prefix blocks reused,
    unreferenced encoder entries) stays evicted: a lost hint, never a wrong answer.
    """

    commits: list[RequestCommit] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    prefix_counters: tuple[int, int] = (0, 0)
    current: Request | None = None  # the request being planned (blamed if planning raises)
    output: SchedulerOutput | None = None  # the step these commits produced, once complete

    @classmethod
    def begin(cls, counters: Mapping[str, int], kv: KVCacheManager) -> StepJournal:
        """An empty journal for a new step, remembering the counters it may have to restore."""
        return cls(
            counters=dict(counters),
            prefix_counters=(kv.prefix_cache_queries, kv.prefix_cache_hits),
        )

    def record(self, request: Request, kv: KVCacheManager) -> RequestCommit:
        """Open the entry for ``request``'s chunk, before anything about it changes."""
        entry = RequestCommit(
            request,
            EncoderCommit(),
            False,
            request.status,
            request.num_computed_tokens,
            request.num_cached_tokens,
            kv.num_blocks_of(request.req_id),
        )
        self.commits.append(entry)
        return entry

    def forget(self, request: Request) -> None:
        """``request`` was preempted: its state is final, an undo must not restore it."""
        self.commits = [entry for entry in self.commits if entry.request is not request]

    def undo(
        self,
        kv: KVCacheManager,
        encoder_cache: EncoderCacheManager,
        worker: WorkerView,
        running: list[Request],
        waiting: deque[Request],
    ) -> None:
        """Restore what the recorded commits changed, newest first."""
        kv.rollback_step()
        for entry in reversed(self.commits):
            request = entry.request
            undo_encoder_commit(request, entry.encoder, encoder_cache)
            kv.truncate(request, entry.prev_num_blocks)
            request.num_computed_tokens = entry.prev_num_computed_tokens
            request.num_cached_tokens = entry.prev_num_cached_tokens
            if entry.admitted:
                running.remove(request)
                request.status = entry.prev_status
                waiting.insert(entry.waiting_index, request)
            if entry.told_worker:
                worker.unsend(request.req_id, entry.was_parked)
        kv.prefix_cache_queries, kv.prefix_cache_hits = self.prefix_counters
