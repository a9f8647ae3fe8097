"""Liveness safety net: notice steps in which no request got closer to finishing."""

from __future__ import annotations

from collections.abc import Iterable

from mmserve.request import Request


class ProgressMonitor:
    """Counts consecutive steps without progress; the engine's one stall policy.

    A step makes progress when a request finishes or some scheduled request's
    ``num_computed_tokens`` exceeds the most it ever had (``Request.max_num_computed_tokens``),
    so recomputing after a preemption is not progress and a preemption cycle is caught as
    surely as an idle step. Invariant: ``steps_without_progress`` is 0 whenever no request is
    live. Past ``limit`` such steps, ``record`` answers True and restarts the count: the caller
    fails the request the scheduler serves first (the one everybody else waits behind) and
    nobody else; if the stall persists, the next one after another ``limit`` steps.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps_without_progress = 0

    def record(self, scheduled: Iterable[Request], num_finished: int, num_live: int) -> bool:
        """Account one step; True when the stall limit is exceeded."""
        progressed = num_finished > 0
        for request in scheduled:
            if request.num_computed_tokens > request.max_num_computed_tokens:
                request.max_num_computed_tokens = request.num_computed_tokens
                progressed = True
        if progressed or num_live == 0:
            self.steps_without_progress = 0
            return False
        self.steps_without_progress += 1
        if self.steps_without_progress > self.limit:
            self.steps_without_progress = 0
            return True
        return False
