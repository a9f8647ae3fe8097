"""Admission: the ``Admission`` interface (``PromptInput`` -> checked ``ProcessedPrompt``) and,
in the server, bounded executors and the ``AdmissionPipeline``, so no request's CPU work runs
on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from mmserve.engine.setup.model_front import ModelFront
from mmserve.inputs import ImageEmbeds, ProcessedPrompt, PromptInput, VideoFrames
from mmserve.multimodal.handles import MediaHandle, is_handle
from mmserve.multimodal.media.fetch import MediaFetcher, is_http_url
from mmserve.multimodal.media.policy import MediaKind
from mmserve.multimodal.processor import InputProcessor, memo_key
from mmserve.multimodal.video.memo import AnyPreparedVideo, VideoLookup
from mmserve.multimodal.workers import MediaWorkers

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
            text_workers=min(4, cpus) if text_workers is None else text_workers,
            media_workers=max(1, min(4, cpus // 2)) if media_workers is None else media_workers,
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
    for task in tasks:
        error = task.exception() if task in done else None
        if error is not None:
            raise error
    return [task.result() for task in tasks]


class Admission(Protocol):
    """What admission needs of a served model, one interface wherever a prompt is admitted:
    the engine's ``RequestIntake`` and the Ray ingress' ``FrontendEngine``. Both hold the
    ``ModelFront`` of one constructor (``ModelFront.load``), so they cannot drift.

    Invariants: ``process`` is thread-safe and blocking (never on the event loop); it raises
    ValueError for any prompt the engine would refuse (``prompt_limits.checked_prompt``), before
    the prompt reaches a step loop; the result's ``cache_salt`` is the prompt's. The intake also
    starts the prompt's encoder store lookups (``store_timeout_s`` bounds the wait for them);
    the ingress has no store (0.0: its replicas look up)."""

    @property
    def front(self) -> ModelFront: ...

    @property
    def store_timeout_s(self) -> float: ...

    def process(self, prompt: PromptInput) -> ProcessedPrompt: ...


class AdmissionPipeline:
    """``PromptInput`` with image and video sources -> ``ProcessedPrompt``, none of it on the
    event loop; the server's asynchronous front of ``Admission.process``.

    Invariants: image and video counts and ``mm_processor_kwargs`` are checked before anything
    is fetched; http(s) sources (any letter case) are fetched by the async ``MediaFetcher``
    (its own concurrency limit and deadline; videos under their own byte limit); every other
    source is read, decoded and preprocessed by the media worker processes or the media pool,
    never by asyncio's default executor; the image and video memo keys include the tenant's
    ``cache_salt``, so a memo hit's timing says nothing across tenants; the first failure
    cancels the request's other fetches and jobs.
    """

    def __init__(
        self,
        admission: Callable[[], Admission],
        executors: AdmissionExecutors,
        fetcher: MediaFetcher,
        media_workers: MediaWorkers | None = None,
    ) -> None:
        """``admission``: the ``Admission`` to use now (an engine's intake is rebuilt by
        ``LLMEngine.warm_up``, so it is asked for at each use)."""
        self._admission = admission
        self.executors = executors
        self.fetcher = fetcher
        self.media_workers = media_workers

    @property
    def processor(self) -> InputProcessor:
        return self._admission().front.processor

    async def admit(self, prompt: PromptInput) -> ProcessedPrompt:
        """``prompt`` with its image and video sources fetched, decoded and preprocessed off
        the loop (``mm_processor_kwargs`` checked before any fetch), then processed."""
        ready = await self.prepare(prompt)
        processed = await self.executors.text(self._admission().process, ready)
        await self.wait_for_store(processed)
        return processed

    async def prepare(self, prompt: PromptInput) -> PromptInput:
        """``prompt`` with its image and video sources fetched, decoded and preprocessed
        (media handles are left for ``Admission.process`` to resolve)."""
        images, videos = prompt.images, prompt.videos
        cache_salt, mm_kwargs = prompt.cache_salt, prompt.mm_processor_kwargs
        processor = self.processor
        processor.check_num_images(len(images))  # before any fetch or decode
        processor.videos.check_count(len(videos))
        processor.check_mm_kwargs(mm_kwargs)
        sources = await gather_or_cancel(
            *(self._fetch_if_remote(src) for src in images),
            *(self._fetch_if_remote(src, "video") for src in videos),
        )
        image_sources, video_sources = sources[: len(images)], sources[len(images) :]
        multi_image = processor.preparer.multi_image(len(images))
        prepared = await gather_or_cancel(
            *(self.prepare_image(src, cache_salt, mm_kwargs, multi_image) for src in image_sources),
            *(self.prepare_video(src, cache_salt, mm_kwargs) for src in video_sources),
        )
        return dataclasses.replace(
            prompt, images=prepared[: len(images)], videos=prepared[len(images) :]
        )

    async def wait_for_store(self, processed: ProcessedPrompt) -> None:
        """Await the prompt's encoder store lookup, if any, up to the store deadline (hits are
        loaded instead of encoded; later answers are ignored)."""
        if processed.store_lookup is not None:
            await processed.store_lookup.wait_async(self._admission().store_timeout_s)

    async def prepare_image(
        self,
        source: Any,
        cache_salt: str | None,
        mm_kwargs: dict[str, Any] | None = None,
        multi_image: bool = False,
    ) -> Any:
        """In a media worker process with the engine's processor settings; in the media
        threads for sources the workers do not take or per-request image settings.
        ``multi_image``: the prompt's images take the multi-image mode (``InputProcessor``).
        A media handle or an ``ImageEmbeds`` comes back as it is."""
        processor = self.processor
        if is_handle(source) or isinstance(source, ImageEmbeds):
            return source  # resolved by ``Admission.process`` (the engine's ``HandleBook``)
        own_settings = processor.image_kwargs(mm_kwargs) is not None
        if self.media_workers is None or not isinstance(source, (bytes, str)) or own_settings:
            return await self.executors.media(
                processor.prepare_image, source, cache_salt, mm_kwargs, multi_image
            )
        key = None
        if isinstance(source, bytes) or source[:5].lower() == "data:":  # not a path: may change
            key = await self.executors.text(memo_key, source, cache_salt, None, multi_image)
            hit = processor.memo.get(key)
            if hit is not None:
                return hit
        prepared = await self.media_workers.run(source, multi_image)
        if key is not None:
            processor.memo.put(key, prepared)
        return prepared

    async def prepare_video(
        self, source: Any, cache_salt: str | None, mm_kwargs: dict[str, Any] | None = None
    ) -> AnyPreparedVideo | MediaHandle | str:
        """Read and hash the video once and look it up in the processor's per-tenant memo
        (``VideoInputs.lookup``, in the media threads); only a miss is decoded
        (``decode_video``) and preprocessed (media threads). A media handle comes back as it
        is."""
        if is_handle(source):
            return source  # resolved by ``Admission.process`` (the engine's ``HandleBook``)
        videos = self.processor.videos
        merged = self.processor.check_mm_kwargs(mm_kwargs)
        look = await self.executors.media(videos.lookup, source, merged, cache_salt)
        if look.hit is not None:
            return look.hit
        frames = look.frames if look.frames is not None else await self.decode_video(look)
        return await self.executors.media(videos.finish, look, frames)

    async def decode_video(self, look: VideoLookup) -> VideoFrames:
        """Decode and sample a memo miss's bytes in a media worker process (the media threads
        without them)."""
        if self.media_workers is None:
            return await self.executors.media(self.processor.videos.decode, look)
        assert look.data is not None
        return await self.media_workers.run_video(look.data, look.sampling)

    async def _fetch_if_remote(self, source: Any, kind: MediaKind = "image") -> Any:
        if isinstance(source, str) and is_http_url(source):
            return await self.fetcher.fetch(source, kind)
        return source

    def shutdown(self) -> None:
        self.executors.shutdown()
        if self.media_workers is not None:
            self.media_workers.shutdown()
