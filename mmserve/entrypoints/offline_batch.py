"""OfflineBatch: one ``LLM.generate`` call's prompts, prepared on worker threads while the engine
steps the ones already admitted."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from tqdm import tqdm

from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import is_handle
from mmserve.sampling_params import SamplingParams


def names_handle(prompt: PromptInput) -> bool:
    """Whether ``prompt`` names a media handle (``RequestIntake.process_all`` orders those)."""
    return any(map(is_handle, [*prompt.images, *prompt.videos]))


class OfflineBatch:
    """A batch's prompts processed on ``threads`` worker threads, admitted in order as each is
    ready while the engine steps the requests admitted so far: the first requests run while
    later images are still decoded and preprocessed (the model's steps leave cores idle
    between operators, and one thread's Python work leaves the others idle).

    Invariants:
    - prompts are admitted (``add_processed``) in the batch's order, each once it is processed
      and its encoder-store lookups are answered or the store deadline has passed since it was
      first seen processed; with no unfinished request the engine waits for the next one
      instead of stepping;
    - a failure (the first bad prompt in the batch's order, bad sampling parameters, an
      interrupt) cancels the prompts not yet started, aborts every admitted request not yet
      finished and is raised: no request of the batch stays queued;
    - outputs are returned in the batch's order.
    """

    def __init__(
        self,
        engine: LLMEngine,
        inputs: Sequence[PromptInput],
        params: Sequence[SamplingParams],
        threads: int,
    ) -> None:
        self.engine = engine
        self.inputs = inputs
        self.params = params
        self.threads = threads
        self.order: dict[str, int] = {}
        self.results: list[RequestOutput | None] = [None] * len(inputs)
        self._done_at: list[float] = [0.0] * len(inputs)  # when each prompt was processed

    def run(self, use_tqdm: bool) -> list[RequestOutput]:
        """Generate for every prompt: processed on the worker threads while the engine steps,
        or, with one thread or a prompt naming a media handle, all processed first
        (``RequestIntake.process_all``, which orders those)."""
        intake = self.engine.intake
        if self.threads <= 1 or len(self.inputs) <= 1 or any(map(names_handle, self.inputs)):
            return self._generate(
                [_done(p) for p in intake.process_all(self.inputs, self.threads)], None, use_tqdm
            )
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="mmserve-intake")
        with pool:
            futures = [pool.submit(intake.process, prompt) for prompt in self.inputs]
            return self._generate(futures, pool, use_tqdm)

    def _generate(
        self,
        futures: list[Future[ProcessedPrompt]],
        pool: ThreadPoolExecutor | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        bar = tqdm(total=len(self.inputs), disable=not use_tqdm, desc="generate")
        admitted = 0
        for index, future in enumerate(futures):
            future.add_done_callback(functools.partial(self._processed, index))
        try:
            while any(r is None for r in self.results):
                idle = not self.engine.has_unfinished_requests()
                while admitted < len(futures) and self._ready(admitted, futures, wait_for=idle):
                    self._admit(admitted, futures[admitted].result())
                    admitted += 1
                    idle = False
                for out in self.engine.step():
                    if out.finished and out.request_id in self.order:
                        self.results[self.order[out.request_id]] = out
                        bar.update(1)
        except BaseException:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            unfinished = [r for r, i in self.order.items() if self.results[i] is None]
            self.engine.abort_request(unfinished)
            raise
        finally:
            bar.close()
        return self.results  # type: ignore[return-value]

    def _processed(self, index: int, _: Future[ProcessedPrompt]) -> None:
        self._done_at[index] = time.monotonic()

    def _ready(self, index: int, futures: list[Future[ProcessedPrompt]], wait_for: bool) -> bool:
        """Whether prompt ``index`` can be admitted now (``wait_for``: block until it can)."""
        future = futures[index]
        if wait_for:
            wait([future])
        elif not future.done():
            return False
        if future.exception() is not None:
            return True  # admitting it raises, in the batch's order
        lookup = future.result().store_lookup
        if lookup is None:
            return True
        now = time.monotonic()
        if not self._done_at[index]:  # done, its callback not yet run
            self._done_at[index] = now
        left = self._done_at[index] + self.engine.intake.store_timeout_s - now
        pending = any(not f.done() for f in lookup.futures.values())
        if pending and left > 0 and not wait_for:
            return False
        lookup.wait(max(left, 0.0))  # counts the late ones
        return True

    def _admit(self, index: int, processed: ProcessedPrompt) -> None:
        prompt = self.inputs[index]
        text = prompt.prompt if isinstance(prompt.prompt, str) else None
        intake = self.engine.intake
        req_id = intake.add_processed(processed, self.params[index], None, text, prompt.cache_salt)
        self.order[req_id] = index


def _done(processed: ProcessedPrompt) -> Future[ProcessedPrompt]:
    future: Future[ProcessedPrompt] = Future()
    future.set_result(processed)
    return future
