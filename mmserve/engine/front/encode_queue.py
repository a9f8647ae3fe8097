"""The engine thread's queue of encode-ahead jobs (``POST /v1/mm/encode``), run one encoder
budget per loop turn between engine steps."""

from __future__ import annotations

import concurrent.futures
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mmserve.engine.errors import EngineStepError
from mmserve.inputs import MultiModalItem

logger = logging.getLogger(__name__)


@dataclass
class EncodeJob:
    items: list[MultiModalItem]  # not yet encoded, in order
    done: concurrent.futures.Future[int]  # the number of images encoded, or the error
    encoded: int = field(default=0)


def split_at_budget(
    items: Sequence[MultiModalItem], budget: int
) -> tuple[list[MultiModalItem], list[MultiModalItem]]:
    """The leading items whose embeddings add up to at most ``budget`` (at least one, since
    admission refuses an item larger than the budget), and the rest."""
    total, cut = 0, 0
    for item in items:
        if cut and total + item.length > budget:
            break
        total += item.length
        cut += 1
    return list(items[:cut]), list(items[cut:])


class EncodeQueue:
    """Encode-ahead jobs, oldest first, owned by the engine thread.

    Invariants: each ``run_once`` encodes at most one encoder budget of embeddings (the
    scheduler's per-step budget, so encode-ahead holds a decoding request up no longer than
    one step's encoder work does), from the oldest job; a job's ``done`` is set exactly once:
    with the images it encoded when its last items ran, with the error when one of its
    chunks failed (the job is dropped), or by ``fail_all`` when the engine stops. A job whose
    client went away (``done`` cancelled) is dropped before it runs.
    """

    def __init__(self) -> None:
        self._jobs: deque[EncodeJob] = deque()

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def add(self, items: list[MultiModalItem], done: concurrent.futures.Future[int]) -> None:
        if done.set_running_or_notify_cancel():
            if items:
                self._jobs.append(EncodeJob(items, done))
            else:
                done.set_result(0)

    def run_once(self, encode: Callable[[list[MultiModalItem]], int], budget: int) -> None:
        """Encode the next budget's worth of the oldest job's items."""
        if not self._jobs:
            return
        job = self._jobs[0]
        chunk, job.items = split_at_budget(job.items, budget)
        try:
            job.encoded += encode(chunk)
        except Exception as exc:
            logger.exception("encoding ahead failed")
            self._jobs.popleft()
            job.done.set_exception(EngineStepError(f"the encoder failed: {exc}"))
            return
        if not job.items:
            self._jobs.popleft()
            job.done.set_result(job.encoded)

    def fail_all(self, exc: BaseException) -> None:
        while self._jobs:
            self._jobs.popleft().done.set_exception(exc)
