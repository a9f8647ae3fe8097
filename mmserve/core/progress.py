"""Liveness: why every admitted request finishes, and the safety net should a bug break it.

Progress guarantee (``Scheduler``): if every item fits the encoder cache and the per-step
encoder budget, ``max_model_len`` fits the KV cache and every prompt is shorter than
``max_model_len`` (the engine validates all three), every admitted request finishes.
Argument: the oldest running request H is scheduled first with the whole token and encoder
budget. KV: H preempts newer requests until its blocks fit, and it fits alone. Encoder: the
entries H can find occupied are held only by occurrences in progress, which need no new
encoder work and finish within a bounded number of steps; once H is refused cache space, no
later request of that step may take any (``StepBudget.encoder_space_reserved``), so those
occurrences drain and H gets the space. Hence H gains >= 1 token within bounded steps,
finishes, and the next oldest becomes H; waiting requests are admitted FCFS as running ones
finish. Encoder-store lookups end (hit, miss or deadline) before a request reaches the
scheduler, and a load needs only the cache space an encode of the same item would. An item
another replica is encoding (a store wait) holds its request back, taking nothing, for a
bounded *time* (``LeaseWaits``: the lease's lifetime, twice at most), after which it is a load
or an encode as above; such steps are not counted as stalls. A child of an ``n > 1``
request that waits for its leader's prefill (``Request.waits_for_leader``) holds the queue
only while the leader, which is ahead of it, runs. ``ProgressMonitor`` notices steps in
which no request got closer to finishing; it is the safety net should a bug break this, and
fails the stuck request only.
"""

from __future__ import annotations

from collections.abc import Iterable

from mmserve.request import Request


class ProgressMonitor:
    """Counts consecutive steps without progress; the engine's one stall policy.

    A step makes progress when a request finishes or some scheduled request's
    ``num_computed_tokens`` exceeds the most it ever had (``Request.max_num_computed_tokens``),
    so recomputing after a preemption is not progress and a preemption cycle is caught as
    surely as an idle step. Invariant: ``steps_without_progress`` is 0 whenever no request is
    live. Past ``limit`` such steps, ``record`` answers True and restarts the count: the caller
    fails the request the scheduler serves first (the one everybody else waits behind) and
    nobody else; if the stall persists, the next one after another ``limit`` steps. A step
    in which a request was held for another replica's encode (``waiting_on_store``) is not
    counted, nor does it reset the count: that wait is bounded in time, not in steps.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps_without_progress = 0

    def record(
        self,
        scheduled: Iterable[Request],
        num_finished: int,
        num_live: int,
        waiting_on_store: bool = False,
    ) -> bool:
        """Account one step; True when the stall limit is exceeded."""
        progressed = num_finished > 0
        for request in scheduled:
            if request.num_computed_tokens > request.max_num_computed_tokens:
                request.max_num_computed_tokens = request.num_computed_tokens
                progressed = True
        if progressed or num_live == 0:
            self.steps_without_progress = 0
            return False
        if waiting_on_store:
            return False
        self.steps_without_progress += 1
        if self.steps_without_progress > self.limit:
            self.steps_without_progress = 0
            return True
        return False
