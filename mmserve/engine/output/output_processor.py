"""Engine outputs: detokenized text, stop strings, finish reasons, per-request errors."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mmserve.engine.output.detokenizer import Detokenizer
from mmserve.engine.output.media_usage import summarize_media
from mmserve.engine.outputs import CompletionOutput, RequestOutput
from mmserve.request import Request, RequestStatus

logger = logging.getLogger(__name__)


class OutputProcessor:
    """Turns requests the engine stepped into ``RequestOutput``s.

    Invariants: text is detokenized incrementally and stop strings are searched only in text
    added since the last output (``text_lengths``), and only once more than ``min_tokens``
    tokens exist (vLLM's rule); a stop string found ends the request through
    ``finish`` and cuts the text before it; an ended request leaves no state here.
    """

    def __init__(
        self, detokenizer: Detokenizer, finish: Callable[[list[str], RequestStatus], None]
    ) -> None:
        self.detokenizer = detokenizer
        self.finish = finish
        self.prompts: dict[str, str | None] = {}
        self.text_lengths: dict[str, int] = {}  # text already searched for stop strings

    def add(self, req_id: str, prompt_text: str | None) -> None:
        self.prompts[req_id] = prompt_text

    def forget(self, req_id: str) -> None:
        self.prompts.pop(req_id, None)
        self.text_lengths.pop(req_id, None)
        self.detokenizer.forget(req_id)

    def error_output(self, request: Request, message: str) -> RequestOutput:
        logger.error("request %s failed: %s", request.req_id, message)
        self.text_lengths.pop(request.req_id, None)
        text = self.detokenizer.finish(request.req_id, request.output_token_ids)
        out = CompletionOutput(0, text, list(request.output_token_ids), "error")
        return RequestOutput(
            request_id=request.req_id,
            prompt=self.prompts.pop(request.req_id, None),
            prompt_token_ids=request.prompt_token_ids,
            outputs=[out],
            finished=True,
            num_cached_tokens=request.num_cached_tokens,
            metrics={"arrival_time": request.arrival_time},
            error=message,
        )

    def make_output(self, request: Request) -> RequestOutput:
        ids = request.output_token_ids
        previous = self.text_lengths.get(request.req_id, 0)
        if request.is_finished:
            text = self.detokenizer.finish(request.req_id, ids)
        else:
            text = self.detokenizer.update(request.req_id, ids)
        stops = request.sampling_params.stop
        # vLLM's rule: stop strings are not looked for until more than min_tokens tokens
        # exist; text of the first min_tokens tokens is marked searched and never cut.
        if stops and len(ids) > request.sampling_params.min_tokens:
            longest = max(len(s) for s in stops)
            cut = Detokenizer.find_stop(text, stops, max(0, previous - longest + 1))
            if cut is not None:
                text = text[:cut]
                if request.is_finished:
                    request.status = RequestStatus.FINISHED_STOPPED
                else:
                    self.finish([request.req_id], RequestStatus.FINISHED_STOPPED)
                    self.detokenizer.forget(request.req_id)
        if request.is_finished:
            self.text_lengths.pop(request.req_id, None)
        else:
            self.text_lengths[request.req_id] = len(text)
        finished = request.is_finished
        prompt = self.prompts.pop(request.req_id, None) if finished else None
        metrics = {"arrival_time": request.arrival_time}
        if request.first_token_time is not None:
            metrics["first_token_time"] = request.first_token_time
        return RequestOutput(
            request_id=request.req_id,
            prompt=prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[
                CompletionOutput(
                    0,
                    text,
                    list(request.output_token_ids),
                    request.status.value if finished else None,
                    None
                    if request.sampling_params.logprobs is None
                    else list(request.output_logprobs),
                )
            ],
            finished=finished,
            num_cached_tokens=request.num_cached_tokens,
            metrics=metrics,
            prompt_logprobs=None
            if request.sampling_params.prompt_logprobs is None
            else request.prompt_logprobs,
            media_usage=summarize_media(request.mm_items, request.mm_sources)
            if finished and request.mm_items
            else [],
        )
