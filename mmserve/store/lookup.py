"""One prompt's pending store lookups: started at admission, read without blocking."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any

import torch

from mmserve.store.metrics import StoreMetrics

Future = concurrent.futures.Future
# a lookup's answer: the embedding, None (a miss: encode here), or the future of the
# embedding another replica holds the encode lease for (``LeaseWaits``)
LookupResult = torch.Tensor | Future[torch.Tensor | None] | None


class StoreLookup:
    """Item key -> future of its ``LookupResult``, filled by the store's threads.

    Invariants: waiting is bounded by the caller's deadline and never cancels a lookup (others
    may share it), nor waits for another replica's encode; ``results`` never blocks: a hit
    is a lookup already resolved to a tensor (or to a wait already ended with one), a wait is
    one still open; anything else is a miss for this prompt, a late lookup too (counted once
    in ``late_lookups``).
    """

    def __init__(self, futures: Mapping[str, Future[LookupResult]], metrics: StoreMetrics):
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

    def results(self) -> tuple[dict[str, torch.Tensor], dict[str, Future[torch.Tensor | None]]]:
        """(item key -> stored embedding, item key -> open wait for another replica's)."""
        hits, waits = {}, {}
        for key, fut in self.futures.items():
            result = _outcome(fut)
            if isinstance(result, Future):
                if not result.done():
                    waits[key] = result
                    continue
                result = _outcome(result)
            if isinstance(result, torch.Tensor):
                hits[key] = result
        return hits, waits

    def hits(self) -> dict[str, torch.Tensor]:
        return self.results()[0]

    def waits(self) -> dict[str, Future[torch.Tensor | None]]:
        return self.results()[1]


def _outcome(fut: Future[Any]) -> Any:
    """A done future's result; None while pending, cancelled or failed."""
    if fut.done() and not fut.cancelled() and fut.exception() is None:
        return fut.result()
    return None
