"""The engine thread's inbox: adds, aborts and encodes from the event loop, drained once per
loop."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from mmserve.engine.errors import EngineShutdownError
from mmserve.engine.front.output_stream import AbortCommand, AddCommand, EncodeCommand

Command = AddCommand | AbortCommand | EncodeCommand


class CommandInbox:
    """Commands queued by any thread for the one engine thread, under a condition it sleeps on.

    Invariants: once stopped, the inbox stays stopped and queues nothing more (an add or an
    encode is refused with ``EngineShutdownError``, an abort dropped: the loop aborts
    everything on its way out); each queued command is taken exactly once, by
    ``wait_for_work`` or by ``stop_and_take_rest``.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._commands: deque[Command] = deque()
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def submit(self, command: Command, accepting: bool = True) -> None:
        """Queue ``command`` and wake the engine thread; ``accepting=False`` refuses it as a
        stopped inbox would (the caller knows the engine is dead)."""
        with self._cv:
            if self._stopping or not accepting:
                if not isinstance(command, AbortCommand):
                    raise EngineShutdownError("the engine is shutting down")
                return
            self._commands.append(command)
            self._cv.notify()

    def wait_for_work(self, busy: Callable[[], bool]) -> list[Command] | None:
        """Sleep until a command is queued, ``busy()`` holds or the inbox stops; then the
        queued commands (maybe none), or None once stopped. ``busy`` runs under the lock."""
        with self._cv:
            self._cv.wait_for(lambda: self._commands or self._stopping or busy())
            if self._stopping:
                return None
            commands = list(self._commands)
            self._commands.clear()
            return commands

    def stop(self) -> None:
        """Stop the inbox and wake the engine thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def stop_and_take_rest(self) -> list[Command]:
        """Stop the inbox; the commands still queued (the engine thread, on its way out)."""
        with self._cv:
            self._stopping = True
            rest = list(self._commands)
            self._commands.clear()
        return rest
