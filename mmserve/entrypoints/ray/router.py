"""``ImageAffinityRouter``: mmserve's Ray Serve request router for the engine replicas."""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from mmserve.entrypoints.ray import routing_stats
from mmserve.entrypoints.ray.rendezvous import DEFAULT_LOAD_FACTOR, RouteKey, place, rank

POLICIES = ("affinity", "pow2")


def replica_name(replica: RunningReplica) -> str:
    return str(replica.replica_id.unique_id)


class ImageAffinityRouter(RequestRouter):
    """Routes each call by its ``route`` keyword (a ``RouteKey``, hashes only).

    Invariants:
    - ``affinity``: replicas are ranked by rendezvous weight of the key's anchor; the first one
      whose in-flight count stays within ``ceil(load_factor x mean)`` after this request goes
      first (a "spill" when it is not the top-ranked one), the others within that cap follow
      in rank order, one per rank, so Ray tries them in that order when a queue is full or a
      queue-length probe is late; a replica at the cap is never offered (a fallback is checked
      against the loads when the choice is made, not when Ray falls back to it).
    - ``pow2``: two random replicas, the one with the shorter queue first and the other as
      its fallback, one per rank (Ray's default policy; kept here so pinned calls and the
      counts work the same for the comparison). The reservation is on the one ranked first.
    - A key with ``pin`` goes to that replica only (to any while it is gone, never nowhere: a
      call Ray cannot place stays pending and blocks the calls sharing its request id); a call
      without a key goes to the replica with the fewest in-flight requests.
    - Loads are this router's own: choices reserved until dispatched, then dispatched minus
      completed (Ray reports every dispatched request's completion exactly once; dispatches
      are reported under Serve's rejection protocol, on by default), kept in
      ``routing_stats.ROUTING`` (read through the module: Ray pickles this module by value,
      the module by reference).
    - Ray matches a routing choice to its request by the internal request id, which the calls
      made while serving one HTTP request share: the ingress makes such calls one at a time.
    """

    def initialize_state(
        self, load_factor: float = DEFAULT_LOAD_FACTOR, policy: str = "affinity", **_: Any
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1, got {load_factor}")
        if policy not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}, got {policy!r}")
        self.load_factor = load_factor
        self.policy = policy

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        routing_stats.ROUTING.set_replicas([replica_name(r) for r in replicas])

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        routing_stats.ROUTING.drop_replica(str(replica_id.unique_id))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_name = {replica_name(r): r for r in candidate_replicas}
        key = pending_request.kwargs.get("route") if pending_request is not None else None
        if isinstance(key, RouteKey) and key.pin is not None:
            if key.pin in by_name:
                return [[by_name[key.pin]]]
            return [list(by_name.values())]  # gone: answered by another (the caller checks)
        loads = routing_stats.ROUTING.loads()
        if not isinstance(key, RouteKey) or self.policy == "pow2":
            names = list(by_name)
            if key is not None:  # pow2: two at random
                names = random.sample(names, min(2, len(names)))
            names.sort(key=lambda r: loads.get(r, 0))
            self._reserve(pending_request, names[0] if names else None)
            return [[by_name[r]] for r in names]  # least loaded (reserved) first, one per rank
        ranked = rank(list(by_name), key.anchor)
        placement = place(ranked, loads, self.load_factor)
        self._reserve(pending_request, ranked[0], placement.order[0], placement.cap)
        return [[by_name[r]] for r in placement.order]

    @staticmethod
    def _reserve(
        request: PendingRequest | None,
        top: str | None,
        first: str | None = None,
        cap: int | None = None,
    ) -> None:
        if request is not None and top is not None:
            rid = request.metadata.internal_request_id
            routing_stats.ROUTING.reserve(rid, first or top, top, cap)

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: Any, result: Any
    ) -> None:
        key = pending_request.kwargs.get("route")
        if not isinstance(key, RouteKey):
            kind = "unkeyed"
        elif key.pin is not None:
            kind = "pinned"
        else:
            kind = self.policy
        request_id = pending_request.metadata.internal_request_id
        routing_stats.ROUTING.on_routed(request_id, str(replica_id.unique_id), kind)

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        routing_stats.ROUTING.on_completed(internal_request_id, str(replica_id.unique_id))
