"""``generate``'s bookkeeping, once for ``AsyncLLMEngine`` (prompts run on its engine thread) and
the Ray ingress' ``RoutedEngine`` (prompts run on a replica): checks, admission, the unfinished
count, latency metrics and the request's outcome."""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from mmserve.engine.admission.pipeline import AdmissionPipeline
from mmserve.engine.metrics.prometheus import RequestTimer, ServerMetrics
from mmserve.engine.outputs import RequestOutput
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.sampling_params import SamplingParams

ParamsLike = SamplingParams | Callable[[int], SamplingParams]


class RequestLifecycle(ABC):
    """``generate`` around ``_dispatch``, where an admitted prompt runs.

    Invariants: ``_check_admissible`` runs before any work; ``_num_unfinished`` counts the calls
    past it that have not ended (``drain`` waits for it to reach 0); each of them ends with one
    ``RequestTimer.finish``: the finish reason, "rejected" (admission or ``params`` raised
    ValueError), "abort" (the consumer left before the finished output) or "error"; a consumer
    leaving early closes the dispatch, which stops the request where it runs.
    """

    admission: AdmissionPipeline
    stats: ServerMetrics
    _num_unfinished: int

    @abstractmethod
    def _check_admissible(self) -> None:
        """Raise (``EngineShutdownError``, ``EngineOverloadedError``) to refuse a request."""

    @abstractmethod
    def _default_params(self) -> SamplingParams: ...

    @abstractmethod
    def _dispatch(
        self, request_id: str, processed: ProcessedPrompt, params: SamplingParams, text: str | None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Run an admitted prompt, yielding its cumulative outputs until the finished one;
        closed before that (the consumer left), it stops the request."""

    async def generate(
        self,
        prompt: PromptInput,
        params: ParamsLike | None = None,
        request_id: str | None = None,
        *,
        processed: ProcessedPrompt | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield cumulative outputs of one request until it finishes.

        ``params`` may be a callable taking the processed prompt's token count (to size
        ``max_tokens`` from the remaining context); a ValueError it raises propagates.
        Raises ``EngineOverloadedError`` / ``EngineShutdownError`` before any work, ValueError
        for bad input, ``EngineStepError`` if the engine fails. Leaving the iteration early
        (break, aclose, cancellation) aborts the request in the engine. ``processed``: a prompt
        admitted elsewhere (the Ray ingress, an internal call; never client input): admission
        is skipped and only ``prompt.prompt`` is read (the output's prompt text).
        """
        self._check_admissible()
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        timer = RequestTimer(self.stats)
        self._num_unfinished += 1
        reason = "error"
        try:
            try:
                if processed is None:
                    processed = await self.admission.admit(prompt)
                params = params(len(processed.prompt_token_ids)) if callable(params) else params
            except ValueError:
                reason = "rejected"
                raise
            text = prompt.prompt if isinstance(prompt.prompt, str) else None
            params = params or self._default_params()
            async with aclosing(self._dispatch(request_id, processed, params, text)) as outs:
                async for out in outs:
                    timer.on_output(sum(len(c.token_ids) for c in out.outputs))
                    if out.finished:
                        reason = out.outputs[0].finish_reason or "stop"
                    yield out
        except (asyncio.CancelledError, GeneratorExit):
            if reason == "error":  # not finished: the consumer went away (also mid-preprocessing)
                reason = "abort"
            raise
        finally:
            self._num_unfinished -= 1
            timer.finish(reason)
