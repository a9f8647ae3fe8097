"""Image preparation in worker processes, out of the server's GIL and at lower CPU priority.

Decoding, hashing and preprocessing a 4K image takes ~200 ms of CPU and holds the GIL in 5-10 ms
slices; in the server process that stalls the engine thread and every stream. Spawned worker
processes (niced) run ``ImagePreparer.prepare`` instead; only the image's bytes go in and the
processor output comes back.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from mmserve.multimodal.image_memo import PreparedImage
from mmserve.multimodal.image_prep import ImagePreparer
from mmserve.multimodal.processor import InputProcessor, memo_key

logger = logging.getLogger(__name__)

WORKER_NICE = 10
_preparer: ImagePreparer | None = None  # one per worker process


def _init_worker(model_config: Any, image_processor: Any, media_policy: Any) -> None:
    global _preparer
    os.nice(WORKER_NICE)
    _preparer = ImagePreparer(model_config, image_processor, media_policy)


def _prepare(source: bytes | str) -> PreparedImage:
    assert _preparer is not None
    return _preparer.prepare(source)


class MediaWorkers:
    """A pool of ``processes`` spawned workers preparing images for one ``InputProcessor``.

    Invariants: at most ``processes`` images are prepared at once; the processor's memo (in this
    process) is consulted first and filled after, so an image resent every turn is prepared
    once; a crashed pool is replaced for the next image, and the image in flight fails alone.
    """

    def __init__(self, processor: InputProcessor, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"media worker processes must be >= 1, got {processes}")
        self.processor = processor
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        if self._pool is None:
            preparer = self.processor.preparer
            self._pool = ProcessPoolExecutor(
                self.processes,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(preparer.model_config, preparer.image_processor, preparer.media_policy),
            )

    async def prepare(self, source: Any) -> PreparedImage:
        """Bytes and ``data:`` URLs go to a worker (memoized); anything else (a local path, a
        PIL image) is prepared by the processor in a thread."""
        memo = self.processor.memo
        if not isinstance(source, (bytes, str)) or (
            isinstance(source, str) and not source.startswith("data:")
        ):
            return await asyncio.to_thread(self.processor.prepare_image, source)
        key = await asyncio.to_thread(memo_key, source)
        prepared = memo.get(key)
        if prepared is None:
            prepared = await self._run(source)
            memo.put(key, prepared)
        return prepared

    async def _run(self, source: bytes | str) -> PreparedImage:
        self.start()
        assert self._pool is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, _prepare, source)
        except BrokenProcessPool:
            logger.error("a media worker process died; starting a new pool")
            self._pool = None
            raise RuntimeError("image preprocessing failed (worker process died)") from None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
