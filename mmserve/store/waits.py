"""Waits for items another replica is encoding: one thread polls them, nobody else blocks."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmserve.store.metrics import StoreMetrics

logger = logging.getLogger(__name__)

POLL_S = 0.01
Awaited = concurrent.futures.Future  # of the stored embedding, or None: encode here
# one poll of a wait: (ended, the stored embedding or None); raising ends it with None
Poll = Callable[[str, int], tuple[bool, torch.Tensor | None]]


@dataclass
class _Wait:
    rows: int
    deadline: float
    future: Awaited[torch.Tensor | None]


class LeaseWaits:
    """Store key -> the future of an item whose encode lease another replica holds.

    Invariants: one future per store key, shared by every prompt that waits for it; only this
    class's daemon thread polls (``poll`` every ``POLL_S``), so no caller, the engine thread
    least of all, ever blocks on a wait; a future resolves to the verified stored embedding
    (``lease_loaded``) or to None, meaning "encode here" (``lease_takeovers``: the lease
    ended without a value and this process took it over, a poll failed, the wait outlived
    ``max_wait_s`` or the store closed); every future resolves within ``max_wait_s`` plus one
    poll. ``changed`` is set whenever a future resolves (``wait_for_change``).
    """

    def __init__(self, poll: Poll, max_wait_s: float, metrics: StoreMetrics) -> None:
        self.poll = poll
        self.max_wait_s = max_wait_s
        self.metrics = metrics
        self.changed = threading.Event()
        self._waits: dict[str, _Wait] = {}
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._waits)

    def watch(self, skey: str, rows: int) -> Awaited[torch.Tensor | None]:
        """The future of ``skey``'s embedding, which another replica is encoding."""
        with self._cv:
            wait = self._waits.get(skey)
            if wait is None:
                future: Awaited[torch.Tensor | None] = concurrent.futures.Future()
                if self._closed:
                    future.set_result(None)
                    return future
                wait = _Wait(rows, time.monotonic() + self.max_wait_s, future)
                self._waits[skey] = wait
                self.metrics.add("lease_waits")
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="mmserve-store-lease-waits", daemon=True
                    )
                    self._thread.start()
                self._cv.notify_all()
            return wait.future

    def wait_for_change(self, timeout: float) -> None:
        """Sleep until a wait ends or ``timeout`` passes (an engine with nothing else to run)."""
        if self.changed.wait(timeout):
            self.changed.clear()

    def close(self) -> None:
        """Stop polling; the waits still open end with None (encode here)."""
        with self._cv:
            self._closed = True
            waits, self._waits = dict(self._waits), {}
            self._cv.notify_all()
        for wait in waits.values():
            self._resolve(wait, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._waits or self._closed)
                if self._closed:
                    return
                waits = list(self._waits.items())
            for skey, wait in waits:
                ended, tensor = self._check(skey, wait)
                if ended:
                    with self._cv:
                        if self._waits.get(skey) is wait:
                            del self._waits[skey]
                    self._resolve(wait, tensor)
            time.sleep(POLL_S)

    def _check(self, skey: str, wait: _Wait) -> tuple[bool, torch.Tensor | None]:
        if time.monotonic() > wait.deadline:
            return True, None
        try:
            return self.poll(skey, wait.rows)
        except Exception as exc:  # the store counted the tier's error; encode here
            logger.debug("encoder store: waiting for %s failed (%s)", skey, exc)
            return True, None

    def _resolve(self, wait: _Wait, tensor: torch.Tensor | None) -> None:
        self.metrics.add("lease_loaded" if tensor is not None else "lease_takeovers")
        if not wait.future.done():
            wait.future.set_result(tensor)
        self.changed.set()
