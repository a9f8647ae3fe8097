"""The undo log that makes ``Scheduler.schedule()`` transactional."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.core.encoder_scheduling import EncoderCommit
from mmserve.core.outputs import SchedulerOutput
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

    Invariant: undoing the entries in reverse order (see ``Scheduler._undo``) restores every
    request's status, queue position, computed tokens, KV blocks and encoder references, and
    every counter. Preemptions are not undone: a preempted request is in a valid state (waiting,
    nothing held) and recomputes later. Cache *content* the step evicted (free prefix blocks
    reused, unreferenced encoder entries) stays evicted: a lost hint, never a wrong answer.
    """

    commits: list[RequestCommit] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    prefix_counters: tuple[int, int] = (0, 0)
    current: Request | None = None  # the request being planned (blamed if planning raises)
    output: SchedulerOutput | None = None  # the step these commits produced, once complete
