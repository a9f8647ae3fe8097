"""Bounded executors for admission work, so none of it runs on the server's event loop."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

MEDIA_NICE = 10  # media threads yield the CPU to the engine thread when both want it


def _lower_priority(nice: int) -> None:
    """Lower this thread's CPU priority (Linux schedules threads individually)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        logger.debug("could not lower the priority of %s", threading.current_thread().name)


class AdmissionExecutors:
    """Two bounded thread pools for the CPU work of admission.

    - ``text``: JSON parsing of large bodies, chat templates, tokenization (short jobs);
    - ``media``: image decoding, hashing and preprocessing (long jobs, lower CPU priority),
      when no ``MediaWorkers`` processes do it (offline use, ``--media-workers 0``).

    Invariants: at most ``text_workers + media_workers`` threads ever run admission work, so a
    burst of large requests queues instead of multiplying threads; text-only requests never
    wait behind image jobs; a job whose caller was cancelled (client gone) before it started
    never runs.
    """

    def __init__(self, text_workers: int, media_workers: int) -> None:
        if text_workers < 1 or media_workers < 1:
            raise ValueError(
                f"admission workers must be >= 1, got text={text_workers} media={media_workers}"
            )
        self.text_workers, self.media_workers = text_workers, media_workers
        self.text_pool = ThreadPoolExecutor(text_workers, thread_name_prefix="mmserve-text")
        self.media_pool = ThreadPoolExecutor(
            media_workers,
            thread_name_prefix="mmserve-media",
            initializer=_lower_priority,
            initargs=(MEDIA_NICE,),
        )

    @classmethod
    def sized_for(
        cls, text_workers: int | None = None, media_workers: int | None = None
    ) -> AdmissionExecutors:
        """Unset sizes default to a few text threads and media threads up to half the cores."""
        cpus = os.cpu_count() or 1
        return cls(
            text_workers=text_workers or min(4, cpus),
            media_workers=media_workers or max(1, min(4, cpus // 2)),
        )

    async def text(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._run(self.text_pool, fn, args)

    async def media(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._run(self.media_pool, fn, args)

    @staticmethod
    async def _run(pool: ThreadPoolExecutor, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        loop = asyncio.get_running_loop()
        # run_in_executor's future cancels the pool job when the awaiting task is cancelled
        return await loop.run_in_executor(pool, functools.partial(fn, *args))

    def shutdown(self) -> None:
        self.text_pool.shutdown(wait=False, cancel_futures=True)
        self.media_pool.shutdown(wait=False, cancel_futures=True)


async def gather_or_cancel(*aws: Awaitable[T]) -> list[T]:
    """Like ``asyncio.gather``, but the first failure cancels the others (a request with one
    bad image stops fetching and decoding the rest)."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    if not tasks:
        return []
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    for task in pending:
        task.cancel()
    errors = [t.exception() for t in tasks if t in done and t.exception() is not None]
    if errors:
        raise errors[0]
    return [task.result() for task in tasks]
