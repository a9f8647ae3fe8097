"""The scheduler's record of which requests the worker holds state for."""

from __future__ import annotations


class WorkerView:
    """Which request ids the worker tracks, and what to tell it next step.

    Invariants: a request id is in at most one of ``known`` (the worker holds its full state)
    and ``parked`` (preempted: the worker keeps only its sampling RNG); an id leaves both when
    the request ends, and is then reported once in the next step's ``finished_req_ids``; a
    preemption of a known request is reported once in ``preempted_req_ids``.
    """

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.parked: set[str] = set()
        self._ended: set[str] = set()
        self._preempted: set[str] = set()

    def knows(self, req_id: str) -> bool:
        return req_id in self.known

    def send(self, req_id: str) -> bool:
        """The worker gets the request's full state this step; returns whether it was parked."""
        was_parked = req_id in self.parked
        self.known.add(req_id)
        self.parked.discard(req_id)
        return was_parked

    def unsend(self, req_id: str, was_parked: bool) -> None:
        """Undo ``send`` (the step is rolled back)."""
        self.known.discard(req_id)
        if was_parked:
            self.parked.add(req_id)

    def preempted(self, req_id: str) -> None:
        if req_id in self.known:
            self.known.discard(req_id)
            self.parked.add(req_id)
            self._preempted.add(req_id)

    def ended(self, req_id: str) -> None:
        if req_id in self.known or req_id in self.parked:
            self.known.discard(req_id)
            self.parked.discard(req_id)
            self._ended.add(req_id)

    def take_changes(self) -> tuple[set[str], set[str]]:
        """(ended, preempted) since the last call."""
        ended, preempted = self._ended, self._preempted
        self._ended, self._preempted = set(), set()
        return ended, preempted
