"""One prompt's pending store lookups: started at admission, read without blocking."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping

import torch

from mmserve.store.metrics import StoreMetrics

Future = concurrent.futures.Future


class StoreLookup:
    """Item key -> future of its embedding (None: a miss), filled by the store's threads.

    Invariants: waiting is bounded by the caller's deadline and never cancels a lookup (others
    may share it); ``hits`` returns only lookups already resolved to a tensor and never blocks,
    so a late lookup is a miss for this prompt (counted once in ``late_lookups``).
    """

    def __init__(self, futures: Mapping[str, Future[torch.Tensor | None]], metrics: StoreMetrics):
        self.futures = dict(futures)
        self.metrics = metrics
        self._waited = False

    def wait(self, timeout: float) -> None:
        if self._waited:
            return
        _, pending = concurrent.futures.wait(self.futures.values(), timeout=timeout)
        self._count_late(len(pending))

    async def wait_async(self, timeout: float) -> None:
        if self._waited:
            return
        pending = [f for f in self.futures.values() if not f.done()]
        if pending:
            wrapped = [asyncio.wrap_future(f) for f in pending]
            await asyncio.wait(wrapped, timeout=timeout)  # never cancels them
            pending = [f for f in pending if not f.done()]
        self._count_late(len(pending))

    def _count_late(self, num_pending: int) -> None:
        self._waited = True
        if num_pending:
            self.metrics.add("late_lookups", num_pending)

    def hits(self) -> dict[str, torch.Tensor]:
        found = {}
        for key, fut in self.futures.items():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                tensor = fut.result()
                if tensor is not None:
                    found[key] = tensor
        return found
