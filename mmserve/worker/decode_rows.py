"""Which steps are decode-only, and their rows: the host-side half of a fixed-shape decode
step (``cuda_graphs.DecodeGraphs`` is the device half)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from mmserve.core.outputs import SchedulerOutput
from mmserve.worker.request_state import RequestState


@dataclass
class DecodeRows:
    """One row per request of a decode-only step, in ``num_scheduled_tokens`` order: the token
    to run, its position (one value, or three for M-RoPE), the request's length after it and
    its block table (which holds the token's slot)."""

    req_ids: list[str]
    token_ids: list[int]
    positions: list[list[int]]
    seq_lens: list[int]
    block_tables: list[torch.Tensor]


def decode_rows(
    sched: SchedulerOutput,
    states: Mapping[str, RequestState],
    max_batch: int,
    max_context: int,
) -> DecodeRows | None:
    """The step's rows when it is decode-only, else None (it runs eagerly).

    Decode-only: no encoder work; at most ``max_batch`` requests, each running exactly one
    token that is its last known one (so it is sampled), outside every image, with no prompt
    logprob to compute, in a sequence of at most ``max_context`` tokens."""
    if sched.scheduled_encoder_inputs or sched.scheduled_encoder_loads:
        return None
    if not sched.num_scheduled_tokens or len(sched.num_scheduled_tokens) > max_batch:
        return None
    rows = DecodeRows([], [], [], [], [])
    for req_id, n in sched.num_scheduled_tokens.items():
        state = states[req_id]
        start = state.num_computed_tokens
        if n != 1 or start + 1 != len(state.token_ids) or start + 1 > max_context:
            return None
        if state.params.prompt_logprobs is not None and start < state.num_prompt_tokens - 1:
            return None
        if any(item.offset <= start < item.end for item in state.mm_items):
            return None
        rows.req_ids.append(req_id)
        rows.token_ids.append(state.token_ids[start])
        rows.positions.append([start] if state.mrope is None else state.mrope.at(start))
        rows.seq_lens.append(start + 1)
        rows.block_tables.append(state.block_table)
    return rows
