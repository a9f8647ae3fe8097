"""Write-behind: store writes run on one background thread through a bounded queue."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from mmserve.store.metrics import StoreMetrics

logger = logging.getLogger(__name__)


class WriteBehind:
    """A bounded FIFO of write jobs drained by one daemon thread.

    Invariants: ``submit`` never blocks (a full queue drops the job and counts
    ``writes_dropped``); jobs run one at a time in submission order; a job that raises is
    logged and counted (``write_errors``), never propagated; ``flush`` waits until every
    job submitted before it has run.
    """

    def __init__(self, capacity: int, metrics: StoreMetrics) -> None:
        if capacity < 1:
            raise ValueError(f"encoder_store_write_queue must be >= 1, got {capacity}")
        self.capacity = capacity
        self.metrics = metrics
        self._jobs: deque[Callable[[], None]] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mmserve-store-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> bool:
        with self._cv:
            if self._closed or len(self._jobs) >= self.capacity:
                self.metrics.add("writes_dropped")
                return False
            self._jobs.append(job)
            self._cv.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._jobs or self._closed)
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                job()
            except Exception:
                logger.exception("encoder store write failed")
                self.metrics.add("write_errors")
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
