"""The engine thread's half of ``AsyncLLMEngine``: the loop that drains its command inbox, encodes
encode-ahead items a budget per turn, steps the engine, delivers outputs to their streams and
publishes the metrics snapshot (the threading contract: ``mmserve.engine.front.async_engine``)."""

from __future__ import annotations

import logging
import threading

from mmserve.engine.errors import EngineDeadError, EngineError, EngineShutdownError, EngineStepError
from mmserve.engine.front.command_inbox import Command, CommandInbox
from mmserve.engine.front.encode_queue import EncodeQueue
from mmserve.engine.front.output_stream import AbortCommand, AddCommand, EncodeCommand, OutputStream
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.outputs import RequestOutput

logger = logging.getLogger("mmserve.engine.front.async_engine")  # its log name before the split


class EngineThreadLoop:
    """What runs on the engine thread (``_run``, its target), for ``AsyncLLMEngine``, which sets
    the state declared here; only that thread calls these methods or touches ``_encodes`` and
    ``_active`` (request id -> its stream, for each request added and not yet finished, aborted
    or failed)."""

    engine: LLMEngine
    _inbox: CommandInbox
    _encodes: EncodeQueue
    _active: dict[str, OutputStream]
    _snapshot: dict[str, float]
    _dead: BaseException | None
    _warm: threading.Event

    def _run(self, warm_up: bool) -> None:
        try:
            if warm_up:
                self.engine.warm_up()
            self._warm.set()
            while True:
                commands = self._inbox.wait_for_work(self._busy)
                if commands is None:
                    break
                for command in commands:
                    self._apply(command)
                self._encodes.run_once(self.engine.encode_items, self.engine.encoder_budget)
                if self.engine.has_unfinished_requests():
                    self._step()
                elif self._active:  # cannot happen unless the engine lost a request
                    self._fail_all(EngineStepError("the engine dropped the request"))
                else:
                    self._publish_snapshot()
        except BaseException as exc:
            logger.exception("the engine loop crashed")
            self._dead = exc
        finally:
            self._warm.set()
            leftover = self._inbox.stop_and_take_rest()
            why = f": {self._dead}" if self._dead is not None else ""
            stopped = EngineShutdownError(f"the engine stopped{why}")
            for command in leftover:
                if isinstance(command, AddCommand):
                    command.stream.put_threadsafe(stopped)
                elif isinstance(command, EncodeCommand) and not command.done.done():
                    command.done.set_exception(stopped)
            self._encodes.fail_all(stopped)
            self._fail_all(stopped)
            self._publish_snapshot()

    def _busy(self) -> bool:
        """Work for the engine thread without a new command (read under the inbox's lock)."""
        return bool(self._encodes) or self.engine.has_unfinished_requests()

    def _apply(self, command: Command) -> None:
        if isinstance(command, EncodeCommand):
            self._encode(command)
            return
        if isinstance(command, AbortCommand):
            owner = self._active.get(command.request_id)
            if owner is not None and command.stream in (None, owner):
                del self._active[command.request_id]
                self._abort([command.request_id])
            return
        try:
            self.engine.intake.add_processed(
                command.processed, command.params, command.request_id, command.prompt_text
            )
        except ValueError as exc:
            command.stream.put_threadsafe(exc)
        except Exception as exc:
            logger.exception("adding request %s failed", command.request_id)
            command.stream.put_threadsafe(EngineStepError(f"could not add the request: {exc}"))
        else:
            self._active[command.request_id] = command.stream

    def _encode(self, command: EncodeCommand) -> None:
        """Queue the command's items; the loop encodes them a budget per turn (``EncodeQueue``)."""
        self._encodes.add(self.engine.intake.take_store_hits(command.processed), command.done)

    def _step(self) -> list[RequestOutput]:
        try:
            outputs = self.engine.step()
        except EngineDeadError:
            raise  # ends the loop: the engine is dead, every request fails on the way out
        except Exception as exc:
            logger.exception("engine step failed; failing %d request(s)", len(self._active))
            self._fail_all(EngineStepError(f"the engine failed: {type(exc).__name__}: {exc}"))
            return []
        self._publish_snapshot()  # before delivering, so a finished client sees fresh metrics
        for out in outputs:
            stream = self._active.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile
            if out.finished:
                del self._active[out.request_id]
            if out.error is not None:
                stream.put_threadsafe(EngineStepError(out.error or "the request failed"))
            else:
                stream.put_threadsafe(out)
        return outputs

    def _fail_all(self, error: EngineError) -> None:
        failed, self._active = self._active, {}
        for stream in failed.values():
            stream.put_threadsafe(error)
        if failed:
            self._abort(list(failed))
        self._publish_snapshot()

    def _abort(self, request_ids: list[str]) -> None:
        try:
            self.engine.abort_request(request_ids)
        except Exception:
            logger.exception("aborting %s failed", request_ids)

    def _publish_snapshot(self) -> None:
        try:
            self._snapshot = dict(self.engine.get_metrics())
        except Exception:
            logger.exception("engine.get_metrics() failed; keeping the previous snapshot")
