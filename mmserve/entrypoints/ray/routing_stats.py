"""Routing bookkeeping shared by the Ray router and the ingress of one process.

Ray builds the router inside the ingress' deployment handle (on its own event-loop thread), so
the ingress cannot hold it; both meet in the process-wide ``ROUTING`` instead.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

RESERVATION_S = 10.0  # a choice not dispatched by then (cancelled while routing) stops counting


@dataclass(frozen=True)
class Reservation:
    """A routing choice made, its request not yet dispatched."""

    first: str  # the replica tried first
    top: str  # the affinity choice (== first unless spilled)
    at: float


class RoutingStats:
    """Thread-safe counts of one process' routing.

    Invariants: ``in_flight[r]`` is the number of requests routed to replica ``r`` and not yet
    completed (never negative); ``loads()`` adds the choices made and not yet dispatched (Ray
    dispatches after a round trip to the replica, and a burst is routed within it); every
    routed request is counted once in ``decisions`` (affinity / spill / pow2 / unkeyed /
    pinned); ``routed[r]`` counts the generation requests sent to ``r`` (a pinned call, the
    ingress asking ``r`` for its stats, is load but not one); ``over_cap`` counts choices that
    put their first replica above the load cap of that moment, counting what is in flight and
    reserved (the load bound says: 0).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.replica_ids: list[str] = []
        self.in_flight: Counter[str] = Counter()
        self.routed: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.over_cap = 0
        self._pending: dict[str, str] = {}  # internal request id -> replica, until completed
        self._reserved: dict[str, Reservation] = {}

    def set_replicas(self, replica_ids: list[str]) -> None:
        with self._lock:
            self.replica_ids = sorted(replica_ids)
            for gone in set(self.in_flight) - set(replica_ids):
                del self.in_flight[gone]

    def drop_replica(self, replica: str) -> None:
        """A replica died: stop listing it before Serve's next replica update."""
        with self._lock:
            self.replica_ids = [r for r in self.replica_ids if r != replica]
            self.in_flight.pop(replica, None)

    def loads(self) -> dict[str, int]:
        """In-flight plus reserved requests per replica."""
        with self._lock:
            now = time.monotonic()
            stale = [k for k, r in self._reserved.items() if now - r.at > RESERVATION_S]
            for key in stale:
                del self._reserved[key]
            loads = {r: self.in_flight[r] for r in self.replica_ids}
            for reservation in self._reserved.values():
                if reservation.first in loads:
                    loads[reservation.first] += 1
            return loads

    def reserve(self, request_id: str, first: str, top: str, cap: int | None = None) -> None:
        """Count a choice against ``first`` until it is dispatched (or goes stale); ``cap``:
        the bound it was chosen under."""
        with self._lock:
            self._reserved.pop(request_id, None)  # chosen again after a retry: counted once
            self._reserved[request_id] = Reservation(first, top, time.monotonic())
            if cap is not None:
                load = self.in_flight[first] + sum(
                    r.first == first for r in self._reserved.values()
                )
                self.over_cap += load > cap

    def on_routed(self, request_id: str, replica: str, kind: str) -> None:
        """``kind``: "affinity" (then affinity or spill by the reservation), "pow2", "unkeyed"
        or "pinned"."""
        with self._lock:
            plan = self._reserved.pop(request_id, None)
            self._pending[request_id] = replica
            self.in_flight[replica] += 1
            if kind != "pinned":
                self.routed[replica] += 1
            if kind == "affinity":
                kind = "affinity" if plan is None or plan.top == replica else "spill"
            self.decisions[kind] += 1
            self.peak[replica] = max(self.peak[replica], self.in_flight[replica])

    def on_completed(self, request_id: str, replica: str) -> None:
        """Only the completion of the send that was routed counts: Ray also calls back for a
        send the replica refused, possibly after the retry was reserved or routed elsewhere
        (reservations are never dropped here; routing or staleness drops them)."""
        with self._lock:
            if self._pending.get(request_id) != replica:
                return
            del self._pending[request_id]
            if self.in_flight[replica] > 0:
                self.in_flight[replica] -= 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "replicas": list(self.replica_ids),
                "in_flight": dict(self.in_flight),
                "routed": dict(self.routed),
                "peak_in_flight": dict(self.peak),
                "decisions": dict(self.decisions),
                "over_cap": self.over_cap,
            }


ROUTING = RoutingStats()
