"""Request: the scheduler's record of one generation."""

from __future__ import annotations

import enum
import time

from mmserve.inputs import MultiModalItem
from mmserve.sampling_params import SamplingParams, TokenLogprobs


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


class EmbeddingSource(enum.IntEnum):
    """How an image's embeddings reached the language model, cheapest first (a request may
    reach one image several ways, e.g. again after preemption: the costliest is kept)."""

    PREFIX_CACHE = 0  # the image's KV was a prefix-cache hit: no embeddings needed
    ENCODER_CACHE = 1
    ENCODER_STORE = 2
    ENCODED = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Request:
    """Prompt ids, image items, generated ids and how far the KV cache has got.

    ``all_token_ids`` is prompt + output; ``num_computed_tokens`` counts the leading tokens whose
    KV is written (or scheduled to be written this step). After preemption it drops to 0 and the
    whole ``all_token_ids`` is prefilled again.

    ``prefill_leader``: for the 2nd..nth child of an ``n > 1`` request, the first child; this
    request is not admitted before the leader's prompt is scheduled through (or the leader
    ended), so it finds the prompt's full blocks in the prefix cache instead of prefilling them
    again. ``prompt_logprobs`` holds one entry per prompt token after the first (if asked for),
    in order; a recomputed chunk (after preemption) does not add entries twice.

    ``mm_sources[i]`` is how item i's embeddings were obtained (the costliest way so far): set
    at an admission whose prefix hit covers the item, or when the encoder walk commits it;
    None until then.

    ``mm_items`` is shared with the worker's state of the request (``NewRequestData``): an
    item's ``stored`` embedding is replaced by None in place once a step reached it
    (``drop_reached_stored``); ``may_hold_stored`` is False once no item holds one. An item
    another replica is encoding carries its future (``awaited``) until ``settle_store_waits``
    replaces it; ``may_await_store`` is False once none does.
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
        prefill_leader: Request | None = None,
    ) -> None:
        self.req_id = req_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.mm_items = sorted(mm_items or [], key=lambda item: item.offset)
        self.mm_sources: list[EmbeddingSource | None] = [None] * len(self.mm_items)
        self.may_hold_stored = True
        self.may_await_store = any(item.awaited is not None for item in self.mm_items)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[TokenLogprobs] = []  # one per output token if asked for
        self.prompt_logprobs: list[TokenLogprobs] = []
        self.prefill_leader = prefill_leader
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

    @property
    def skips_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position's logits: no prefix hits (as in vLLM)."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def waits_for_leader(self) -> bool:
        leader = self.prefill_leader
        if leader is None or leader.is_finished:
            return False
        return leader.num_computed_tokens < leader.num_prompt_tokens

    def note_mm_source(self, index: int, source: EmbeddingSource) -> bool:
        """Record that item ``index`` was served by ``source`` unless a costlier way already
        was; True when the record changed."""
        known = self.mm_sources[index]
        if known is not None and known >= source:
            return False
        self.mm_sources[index] = source
        return True

    def add_prompt_logprobs(self, first: int, entries: list[TokenLogprobs]) -> None:
        """``entries`` are those of prompt tokens ``first + 1, first + 2, ...``."""
        have = len(self.prompt_logprobs)
        if first + len(entries) > have:
            self.prompt_logprobs.extend(entries[max(0, have - first) :])

    def append_output_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def check_stop(self) -> RequestStatus | None:
        """Finished status implied by the last generated token, or None to keep going."""
        params = self.sampling_params
        last = self.output_token_ids[-1]
        # below min_tokens the sampler masks EOS / stop ids unless nothing else is allowed (a
        # complete grammar): one sampled there ends the request like any other
        if not params.ignore_eos and last in self.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and len(self.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.max_model_len is not None and self.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
