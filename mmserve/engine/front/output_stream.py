"""What crosses between the event loop and the engine thread: a request's output stream, and
the add / abort / encode commands the thread drains from its inbox."""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass

from mmserve.engine.outputs import RequestOutput
from mmserve.inputs import ProcessedPrompt
from mmserve.sampling_params import SamplingParams


class OutputStream:
    """Output slot of one request, consumed on the event loop that created it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._latest: RequestOutput | None = None
        self._error: BaseException | None = None
        self._event = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Event-loop side: newer cumulative outputs replace older unread ones."""
        if isinstance(item, BaseException):
            self._error = self._error or item
        else:
            self._latest = item
        self._event.set()

    def put_threadsafe(self, item: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.put, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> RequestOutput:
        while True:
            if self._latest is not None:
                out, self._latest = self._latest, None
                return out
            if self._error is not None:
                raise self._error
            self._event.clear()
            await self._event.wait()


@dataclass
class AddCommand:
    """Engine thread: queue this processed request and publish its outputs to ``stream``."""

    request_id: str
    processed: ProcessedPrompt
    params: SamplingParams
    prompt_text: str | None
    stream: OutputStream


@dataclass
class AbortCommand:
    """Engine thread: abort this request (only if ``stream`` still owns the id, when given)."""

    request_id: str
    stream: OutputStream | None = None  # only abort if this stream still owns the request id


@dataclass
class EncodeCommand:
    """Engine thread: encode this processed encode-only prompt's images, a budget per loop
    turn (``EncodeQueue``); ``done`` gets the number encoded or the error (a cancelled
    ``done`` is skipped)."""

    processed: ProcessedPrompt
    done: concurrent.futures.Future[int]
