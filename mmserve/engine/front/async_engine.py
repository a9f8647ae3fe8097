"""AsyncLLMEngine: the LLMEngine step loop in one background thread, asyncio streams out.

Threading contract (the LLMEngine is not thread-safe):
- ONE dedicated thread ("mmserve-engine") owns the engine: only it calls
  ``intake.add_processed``, ``abort_request``, ``step`` and ``get_metrics``. Adds and aborts
  reach it through a ``CommandInbox`` drained at the top of every loop iteration; with
  nothing to do the thread sleeps on the inbox's condition (no busy spin).
- After every iteration the thread publishes a fresh ``get_metrics()`` dict; readers on other
  threads only ever see a complete snapshot (``AsyncLLMEngine.get_metrics``).
- Outputs go back to the event loop with ``loop.call_soon_threadsafe`` into a per-request
  stream. Outputs are cumulative, so a stream keeps only the newest one (a slow consumer
  cannot make memory grow) plus a terminal error, if any.
- Admission never runs on the event loop: http(s) images are fetched asynchronously by the
  ``MediaFetcher`` (its own concurrency limit and deadlines), decoding / hashing / HF
  preprocessing run in the bounded ``media`` pool and tokenization in the ``text`` pool of
  ``AdmissionExecutors``; a cancelled request stops its fetches and its queued jobs.
- ``drain`` (graceful shutdown): new requests get ``EngineShutdownError`` (503) while admitted
  ones run to completion, up to a deadline; then the loop stops and the rest fail.
- A consumer that stops early (client disconnect: CancelledError / GeneratorExit) aborts its
  request, which frees its KV blocks and encoder-cache references.
- A request the engine failed alone (finish reason "error": its input broke a step, or it
  could not progress) gets ``EngineStepError`` with the engine's message; nobody else does.
  A ``step`` that raises anything else cannot be attributed: it fails the in-flight requests
  and the loop goes on. ``EngineDeadError`` (a fatal device error) or an unexpected loop crash
  marks the engine dead (``check_health`` raises, so /health answers 503).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from mmserve.engine.admission.pipeline import Admission, AdmissionExecutors, AdmissionPipeline
from mmserve.engine.errors import EngineOverloadedError, EngineShutdownError
from mmserve.engine.front.command_inbox import Command, CommandInbox
from mmserve.engine.front.encode_queue import EncodeQueue
from mmserve.engine.front.engine_thread import EngineThreadLoop
from mmserve.engine.front.output_stream import (
    AbortCommand,
    AddCommand,
    EncodeCommand,
    OutputStream,
)
from mmserve.engine.front.request_lifecycle import RequestLifecycle
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.loop.warmup import warmup_image_bytes
from mmserve.engine.metrics.prometheus import ServerMetrics
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import HandleRecord
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.workers import MediaWorkers
from mmserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncLLMEngine(RequestLifecycle, EngineThreadLoop):
    """Serves one ``LLMEngine`` to asyncio callers; see the module docstring for threading,
    ``RequestLifecycle`` for ``generate`` and ``EngineThreadLoop`` for the engine thread."""

    def __init__(
        self,
        engine: LLMEngine,
        *,
        max_queued_requests: int | None = None,
        start: bool = True,
        executors: AdmissionExecutors | None = None,
        fetcher: MediaFetcher | None = None,
        media_workers: MediaWorkers | None = None,
        admission: Callable[[], Admission] | None = None,
    ) -> None:
        """Wrap ``engine``; ``start=False`` leaves starting the loop thread to ``start()``.
        ``fetcher`` fetches http(s) images (default: the engine's media policy);
        ``media_workers`` prepares images in worker processes (default: the media threads);
        ``admission``: where prompts are admitted (default: the engine's current intake)."""
        if max_queued_requests is not None and max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {max_queued_requests}")
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self.admission = AdmissionPipeline(
            admission or (lambda: engine.intake),
            executors or AdmissionExecutors.sized_for(),
            fetcher or MediaFetcher(engine.processor.media_policy),
            media_workers,
        )
        self._draining = False
        self.stats = ServerMetrics(self.get_metrics)
        self._inbox = CommandInbox()
        self._encodes = EncodeQueue()  # engine thread only
        self._active: dict[str, OutputStream] = {}  # engine thread only
        self._snapshot: dict[str, float] = dict(engine.get_metrics())
        self._num_unfinished = 0  # event loop only: admitted generate() calls not yet ended
        self._dead: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._warm = threading.Event()  # set once the loop thread's warm-up is over
        if start:
            self.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def chat_template(self) -> ChatTemplate:
        return self.engine.chat_template

    @property
    def generation_defaults(self) -> dict[str, Any]:
        return self.engine.generation_defaults

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, warm_up: bool = False) -> None:
        """Start the loop thread; with ``warm_up`` it first runs ``LLMEngine.warm_up`` (on
        that thread: OpenMP thread teams and oneDNN state are per thread, so a warm-up on
        another one would leave the first request cold). ``warm_up()`` waits for it."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(warm_up,), name="mmserve-engine", daemon=True
        )
        self._thread.start()
        if self.admission.media_workers is not None:
            self.admission.media_workers.start()

    def wait_warm(self) -> None:
        """Block until the loop thread's warm-up is over; RuntimeError if it failed."""
        self._warm.wait()
        if self._dead is not None:
            raise RuntimeError(f"the engine warm-up failed: {self._dead}") from self._dead

    async def warm_up(self) -> None:
        """Before the first request (after ``start(warm_up=True)``): wait for the engine's
        warm-up, then warm the media worker processes."""
        await asyncio.to_thread(self.wait_warm)
        await self.warm_up_media()

    async def warm_up_media(self) -> None:
        """Prepare the warm-up image in every media worker process (a spawned worker imports
        torch and the processor on its first job). A failure is only logged: a broken pool is
        replaced on the next image anyway."""
        workers = self.admission.media_workers
        if workers is None:
            return
        started = time.perf_counter()
        try:
            await workers.warm_up(await asyncio.to_thread(warmup_image_bytes))
        except Exception as exc:
            logger.warning("media worker warm-up failed: %s", exc)
            return
        seconds = time.perf_counter() - started
        logger.info("media workers: %d process(es) warm in %.2f s", workers.processes, seconds)

    @property
    def fetcher(self) -> MediaFetcher:
        return self.admission.fetcher

    def stop_loop(self, timeout: float = 10.0) -> None:
        """Stop the loop; in-flight and queued requests fail with ``EngineShutdownError``."""
        self._inbox.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("engine thread did not stop within %.1f s", timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop, then the admission pools and worker processes."""
        self.stop_loop(timeout)
        self.admission.shutdown()
        self.engine.close()

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, let admitted ones finish for up to ``timeout`` seconds, then
        stop the loop (the rest fail with ``EngineShutdownError``). Returns how many were cut."""
        self._draining = True
        deadline = asyncio.get_running_loop().time() + timeout
        while self._num_unfinished and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        cut = self._num_unfinished
        await asyncio.to_thread(self.stop_loop)  # admission pools stay up for the lifespan
        return cut

    @property
    def stopping(self) -> bool:
        """``stop_loop`` was called (or the loop ended): no new work is taken."""
        return self._inbox.stopping

    def check_health(self) -> None:
        """Raise ``EngineShutdownError`` unless the loop thread is up and accepting work."""
        if self._dead is not None:
            name = type(self._dead).__name__
            raise EngineShutdownError(f"the engine is dead after {name} (see the server log)")
        if self._draining:
            raise EngineShutdownError("the server is shutting down")
        if self.stopping or self._thread is None or not self._thread.is_alive():
            raise EngineShutdownError("the engine is not running (shutting down)")

    async def run_text(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run short CPU work (chat templates, JSON parsing) in the bounded text pool."""
        return await self.admission.executors.text(fn, *args)

    def get_metrics(self) -> dict[str, float]:
        """The latest snapshot published by the engine thread (a copy)."""
        return dict(self._snapshot)

    @property
    def num_queued_requests(self) -> int:
        """Admitted requests not running yet (preprocessing, in the inbox or waiting)."""
        running = int(self._snapshot.get("num_requests_running", 0))
        return max(0, self._num_unfinished - running)

    # ---- event-loop side (``RequestLifecycle.generate`` calls these) ----------------------
    def _check_admissible(self) -> None:
        self.check_health()
        limit = self.max_queued_requests
        if limit is not None and self.num_queued_requests >= limit:
            raise EngineOverloadedError(
                f"the server is overloaded: {self.num_queued_requests} requests are queued"
                f" (--max-queued-requests {limit}); retry later"
            )

    def _default_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    async def _dispatch(
        self, request_id: str, processed: ProcessedPrompt, params: SamplingParams, text: str | None
    ) -> AsyncGenerator[RequestOutput, None]:
        """On the engine thread; an abort frees the request's KV blocks and encoder refs."""
        stream = OutputStream(asyncio.get_running_loop())
        self._submit(AddCommand(request_id, processed, params, text, stream))
        finished = False
        try:
            while not finished:
                out = await stream.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self._submit(AbortCommand(request_id, stream))

    async def encode(self, prompt: PromptInput) -> list[HandleRecord]:
        """Encode-ahead (``POST /v1/mm/encode``): the prompt's images fetched and prepared off
        the loop as any prompt's are, admitted (``RequestIntake.admit_encode``: every limit of
        a prompt), encoded on the engine thread a budget per loop turn, then their handles
        registered. No LM work, no request in the scheduler."""
        self._check_admissible()
        return await self.encode_prepared(await self.admission.prepare(prompt))

    async def encode_prepared(self, ready: PromptInput) -> list[HandleRecord]:
        """``encode`` of a prompt whose images are prepared already (the Ray ingress did)."""
        self._check_admissible()
        intake = self.engine.intake
        processed, records = await self.run_text(intake.admit_encode, ready)
        await self.admission.wait_for_store(processed)
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._submit(EncodeCommand(processed, done))
        await asyncio.wrap_future(done)
        self.engine.handles.register(records, ready)
        return records

    def _submit(self, command: Command) -> None:
        self._inbox.submit(command, accepting=self._dead is None)
