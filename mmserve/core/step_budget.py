"""What one step may still schedule while ``Scheduler.schedule()`` plans it."""

from __future__ import annotations

from dataclasses import dataclass

from mmserve.core.encoder_scheduling import EncoderPlan


@dataclass
class StepBudget:
    """The token and encoder budgets left to the requests not yet planned this step.

    Invariants: ``tokens`` starts at ``max_num_batched_tokens`` and ``encoder_embeddings`` at
    the encoder compute budget; each committed plan is charged, and no plan asks for more than
    is left, so neither goes below 0. ``encoder_space_reserved``: a request planned earlier in
    the step was refused encoder-cache space (``EncoderPlan.blocked_on_space``); from then on
    no request of the step may take any, so the space that finishing occurrences free goes to
    the earlier request. ``held_for_store`` counts the requests whose chunk ended before an
    item another replica is encoding (``EncoderPlan.awaits_store``).
    """

    tokens: int
    encoder_embeddings: int
    encoder_space_reserved: bool = False
    held_for_store: int = 0

    def note_refusal(self, plan: EncoderPlan) -> None:
        self.encoder_space_reserved |= plan.blocked_on_space
        self.held_for_store += plan.awaits_store

    def charge(self, plan: EncoderPlan) -> None:
        self.tokens -= plan.num_new_tokens
        self.encoder_embeddings -= plan.num_embeddings_to_encode
