"""Request: the scheduler's record of one generation."""

from __future__ import annotations

import enum
import time

from mmserve.inputs import MultiModalItem
from mmserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # failed alone: its input broke a step, or it could not progress

    @property
    def is_finished(self) -> bool:
        return self.value in ("stop", "length", "abort", "error")


class Request:
    """Prompt ids, image items, generated ids and how far the KV cache has got.

    ``all_token_ids`` is prompt + output; ``num_computed_tokens`` counts the leading tokens whose
    KV is written (or scheduled to be written this step). After preemption it drops to 0 and the
    whole ``all_token_ids`` is prefilled again.
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        mm_items: list[MultiModalItem] | None = None,
        eos_token_ids: tuple[int, ...] = (),
        max_model_len: int | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.req_id = req_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.mm_items = sorted(mm_items or [], key=lambda item: item.offset)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.max_num_computed_tokens = 0  # high-water mark, for ProgressMonitor
        self.num_cached_tokens = 0
        self.cache_salt = cache_salt
        self.block_hashes: list[bytes] = []  # one per full block of all_token_ids, see BlockHasher
        self.status = RequestStatus.WAITING
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def check_stop(self) -> RequestStatus | None:
        """Finished status implied by the last generated token, or None to keep going."""
        params = self.sampling_params
        last = self.output_token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and len(self.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.max_model_len is not None and self.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
