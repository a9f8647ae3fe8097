"""Image preparation in worker processes, out of the server's GIL and at lower CPU priority.

Decoding, hashing and preprocessing a 4K image takes ~200 ms of CPU and holds the GIL in 5-10 ms
slices; in the server process that stalls the engine thread and every stream. Spawned worker
processes (niced) run ``ImagePreparer.prepare`` instead; only the image's bytes go in and the
processor output comes back. Videos are decoded there too (``VideoLoader.load``): the encoded
bytes and the sampling settings go in, the sampled frames come back.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from mmserve.inputs import VideoFrames
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.image.prep import ImagePreparer
from mmserve.multimodal.process_pools import STOP_TIMEOUT_S, stop_process_pool
from mmserve.multimodal.processor import InputProcessor
from mmserve.multimodal.video.decode import VideoLimits
from mmserve.multimodal.video.sampling import VideoSampling
from mmserve.multimodal.video.source import VideoLoader

logger = logging.getLogger(__name__)

WORKER_NICE = 10
_preparer: ImagePreparer | None = None  # one per worker process
_videos: VideoLoader | None = None


def _init_worker(
    model_config: Any,
    image_processor: Any,
    media_policy: Any,
    preprocessing: str,
    video_sampling: VideoSampling,
    video_limits: VideoLimits,
) -> None:
    global _preparer, _videos
    os.nice(WORKER_NICE)
    _preparer = ImagePreparer(model_config, image_processor, media_policy, preprocessing)
    _videos = VideoLoader(media_policy, video_sampling, video_limits)


def _prepare(source: bytes | str, multi_image: bool) -> PreparedImage:
    assert _preparer is not None
    return _preparer.prepare(source, multi_image)


def _load_video(source: bytes | str, sampling: VideoSampling) -> VideoFrames:
    assert _videos is not None
    return _videos.load(source, sampling)


class MediaWorkers:
    """A pool of ``processes`` spawned workers preparing images for one ``InputProcessor``.

    Invariants: at most ``processes`` images are prepared at once; a crashed pool is shut down
    and replaced for the next image (the images it held fail); after ``shutdown`` nothing is
    started again. Memoization is the caller's (``Admission``), in the server process.
    """

    def __init__(self, processor: InputProcessor, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"media worker processes must be >= 1, got {processes}")
        self.processor = processor
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def start(self) -> None:
        if self._pool is None and not self._closed:
            preparer = self.processor.preparer
            self._pool = ProcessPoolExecutor(
                self.processes,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(
                    preparer.model_config,
                    preparer.image_processor,
                    preparer.media_policy,
                    preparer.preprocessing,
                    self.processor.video_loader.sampling,
                    self.processor.video_loader.limits,
                ),
            )

    async def warm_up(self, source: bytes) -> None:
        """Start every process and prepare ``source`` in each (a spawned worker imports torch
        and the processor, which would otherwise land on the first image it is given)."""
        await asyncio.gather(*(self.run(source) for _ in range(self.processes)))

    async def run(self, source: bytes | str, multi_image: bool = False) -> PreparedImage:
        """Prepare encoded bytes, a data URL or a local path (under the media policy), in the
        multi-image mode if asked (``ImagePreparer.prepare``)."""
        return await self._submit("image preprocessing", _prepare, source, multi_image)

    async def run_video(self, source: bytes | str, sampling: VideoSampling) -> VideoFrames:
        """Decode and sample encoded video bytes, a data URL or a local path."""
        return await self._submit("video decoding", _load_video, source, sampling)

    async def _submit(self, what: str, fn: Any, *args: Any) -> Any:
        self.start()
        pool = self._pool
        if pool is None:
            raise RuntimeError("the media workers are shut down")
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            logger.error("a media worker process died; starting a new pool")
            if self._pool is pool:
                self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise RuntimeError(f"{what} failed (worker process died)") from None

    def shutdown(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the workers; returns once they have ended (``stop_process_pool``), so it
        blocks for up to twice ``timeout_s``: call it off the event loop."""
        self._closed = True
        if self._pool is not None:
            stop_process_pool(self._pool, timeout_s)
            self._pool = None
