"""MediaWorkers: images prepared in worker processes equal the in-process preparation, are
memoized in the server process per tenant (``AdmissionPipeline``), and a dead worker fails one
image, not the next."""

from __future__ import annotations

import asyncio
import base64
import io
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from mmserve.engine.admission.pipeline import AdmissionExecutors, AdmissionPipeline
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.workers import MediaWorkers
from tests.support.images import make_image


def jpeg_bytes(seed: int) -> bytes:
    buf = io.BytesIO()
    make_image(seed, (320, 200)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("model", ["tiny-llava", "tiny-qwen2-vl"])
def test_worker_output_equals_in_process_and_is_memoized(model: str) -> None:
    engine = LLMEngine.from_args(model)
    workers = MediaWorkers(engine.processor, 1)
    fetcher = MediaFetcher(engine.processor.media_policy)
    admission = AdmissionPipeline(lambda: engine.intake, AdmissionExecutors(1, 1), fetcher, workers)
    raw = jpeg_bytes(1)
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg_bytes(2)).decode()

    async def run() -> None:
        for source in (raw, url):
            got = await admission.prepare_image(source, None)
            want = engine.processor.preparer.prepare(source)
            assert (got.mm_hash, got.length, got.size) == (want.mm_hash, want.length, want.size)
            got_arrays = got.data.values() if isinstance(got.data, dict) else [got.data]
            want_arrays = want.data.values() if isinstance(want.data, dict) else [want.data]
            for a, b in zip(got_arrays, want_arrays, strict=True):
                assert np.array_equal(np.asarray(a), np.asarray(b))
        hits = engine.processor.memo.hits
        await admission.prepare_image(raw, None)
        assert engine.processor.memo.hits == hits + 1
        await admission.prepare_image(raw, "other-tenant")  # the memo is per tenant
        assert engine.processor.memo.hits == hits + 1
        await admission.prepare_image(raw, "other-tenant")
        assert engine.processor.memo.hits == hits + 2
        with pytest.raises(ValueError, match="could not decode"):
            await workers.run(b"not an image")

    try:
        asyncio.run(run())
    finally:
        admission.shutdown()


def test_a_dead_worker_fails_one_image_and_the_pool_recovers() -> None:
    engine = LLMEngine.from_args("tiny-llava")
    workers = MediaWorkers(engine.processor, 1)

    async def run() -> None:
        await workers.run(jpeg_bytes(3))
        assert workers._pool is not None
        for pid in list(workers._pool._processes):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="worker process died"):
            await workers.run(jpeg_bytes(4))
        prepared = await workers.run(jpeg_bytes(5))
        assert prepared.length > 0

    try:
        asyncio.run(run())
    finally:
        workers.shutdown()


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread"]


def test_shutdown_returns_once_the_workers_and_the_pool_thread_ended() -> None:
    # Python 3.11 wakes a pool's thread at interpreter exit without a lock: a thread still
    # closing its pipe then printed "OSError: [Errno 9] Bad file descriptor" after a clean stop
    engine = LLMEngine.from_args("tiny-llava")
    workers = MediaWorkers(engine.processor, 1)
    asyncio.run(workers.run(jpeg_bytes(6)))
    assert multiprocessing.active_children() and _pool_threads()
    workers.shutdown()
    assert multiprocessing.active_children() == []
    assert _pool_threads() == []


def test_shutdown_ends_a_busy_worker_after_the_timeout() -> None:
    engine = LLMEngine.from_args("tiny-llava")
    workers = MediaWorkers(engine.processor, 1)

    async def start_a_long_job() -> None:
        await workers.run(jpeg_bytes(7))
        asyncio.ensure_future(workers._submit("sleeping", time.sleep, 60))
        await asyncio.sleep(0.5)  # the worker has taken the job

    loop = asyncio.new_event_loop()
    loop.run_until_complete(start_a_long_job())
    t0 = time.monotonic()
    workers.shutdown(timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert multiprocessing.active_children() == []
    assert _pool_threads() == []
    loop.close()
