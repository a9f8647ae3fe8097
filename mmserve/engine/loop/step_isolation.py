"""One engine step that fails only the requests whose inputs make it fail."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.core.outputs import SchedulerOutput
from mmserve.core.scheduler import Scheduler, SchedulingError
from mmserve.engine.errors import EngineDeadError, is_fatal_error
from mmserve.request import Request, RequestStatus
from mmserve.worker.model_runner import ModelRunner


@dataclass
class StepResult:
    updated: list[Request] = field(default_factory=list)  # got a token (finished ones too)
    ran: list[Request] = field(default_factory=list)  # scheduled in a (sub-)step that ran
    failed: list[tuple[Request, str]] = field(default_factory=list)  # failed alone, with why


class IsolatingStepper:
    """schedule -> execute -> update, isolating failures to the requests that cause them.

    Invariants:
    - a request fails only if its own planning raised (``SchedulingError`` names it) or two
      steps in a row holding it alone raised; so a transient failure (one out-of-memory, even
      one that hits the retry of an innocent request) costs retries, not the request;
    - a failed execute is rolled back on both sides before any retry (the worker undoes itself,
      ``Scheduler.rollback_step`` restores references, blocks and counters), then the failed
      step's requests are retried in halves (``schedule(only=...)``): k culprits among n
      requests cost O(k log n) extra steps, and every successful part is a real step;
    - a fatal error (``is_fatal_error``: the device is in an unknown state) is never retried:
      it raises ``EngineDeadError``.
    """

    def __init__(self, scheduler: Scheduler, runner: ModelRunner) -> None:
        self.scheduler = scheduler
        self.runner = runner

    def step(self) -> StepResult:
        result = StepResult()
        self._execute(self._schedule(None, result), result, solo_failures=0)
        return result

    def _schedule(self, only: set[str] | None, result: StepResult) -> SchedulerOutput:
        while True:  # each failure removes one request, so this ends
            try:
                return self.scheduler.schedule(only)
            except SchedulingError as exc:
                culprit = exc.request
                if culprit is None or culprit.req_id not in self.scheduler.requests:
                    raise
                self._fail(culprit, f"the scheduler failed on this request: {exc}", result)

    def _execute(self, sched: SchedulerOutput, result: StepResult, solo_failures: int) -> None:
        """``solo_failures``: how often in a row the one request of this retry failed alone."""
        try:
            output = self.runner.execute(sched)
        except Exception as exc:
            if is_fatal_error(exc):
                raise EngineDeadError(f"the engine is dead after a fatal error: {exc}") from exc
            self.scheduler.rollback_step(sched)
            self._isolate(list(sched.num_scheduled_tokens), exc, result, solo_failures)
            return
        requests = self.scheduler.requests
        result.ran.extend(requests[r] for r in sched.num_scheduled_tokens if r in requests)
        result.updated.extend(self.scheduler.update(sched, output))

    def _isolate(
        self, suspects: list[str], exc: Exception, result: StepResult, solo_failures: int
    ) -> None:
        if not suspects:  # only the ended / preempted / evicted bookkeeping failed: a bug
            raise exc
        if len(suspects) == 1:
            failures = solo_failures + 1
            request = self.scheduler.requests.get(suspects[0])
            if failures >= 2 and request is not None:
                self._fail(request, f"{type(exc).__name__}: {exc}", result)
            elif request is not None:
                self._execute(self._schedule({request.req_id}, result), result, failures)
            return
        mid = len(suspects) // 2
        for part in (suspects[:mid], suspects[mid:]):
            self._execute(self._schedule(set(part), result), result, solo_failures=0)

    def _fail(self, request: Request, message: str, result: StepResult) -> None:
        self.scheduler.finish_requests([request.req_id], RequestStatus.FINISHED_ERROR)
        result.failed.append((request, message))
