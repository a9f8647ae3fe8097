"""Paged attention through torch's ``flex_attention``: all sequences of a step in one call per
layer, K/V read in place from the paged cache (no gathered copies).

The block mask maps every cache slot to its position in each sequence: a slot is visible to a
query row when its block is in that row's sequence block table and its position is at or
before the row's own (causal). A block shared by several sequences (prefix caching) maps to a
position in each. Compiled on CUDA; on CPU it runs eagerly, which materializes the scores over
the whole cache (fine for the tests that check it against the other paths, not for serving).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

_compiled: dict[str, Callable[..., Any]] = {}

# Always flex's main Triton template. With BACKEND "AUTO", a step of fewer than 128 query rows
# (decode, a short chunk) lowers to its decoding template, which found no valid config for
# these shapes on an H200 (torch 2.11: NoValidChoicesError on a 96-token chunk in float32).
_KERNEL_OPTIONS = {"BACKEND": "TRITON"}


def _flex(device: torch.device) -> Callable[..., Any]:
    if device.type != "cuda":
        return flex_attention
    if "cuda" not in _compiled:
        _compiled["cuda"] = torch.compile(flex_attention, dynamic=True)
    return _compiled["cuda"]


@dataclass
class FlexAttentionPlan:
    """One step's block mask over (flat query rows) x (cache slots), shared by every layer."""

    block_mask: BlockMask

    @classmethod
    def build(
        cls,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        query_lens: list[int],
        block_size: int,
        num_slots: int,
    ) -> FlexAttentionPlan:
        device = block_tables.device
        tables = block_tables.long()
        num_seqs, num_tokens = len(query_lens), sum(query_lens)
        q_lens = torch.tensor(query_lens, device=device)
        seq_of_row = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)
        first_pos = seq_lens.long() - q_lens  # position of each sequence's first query row
        start = query_start_loc[:-1].long()
        row_pos = (
            torch.arange(num_tokens, device=device) - start[seq_of_row] + first_pos[seq_of_row]
        )
        # logical[s, b]: which block of sequence s the cache block b is, -1 when not its own
        logical = torch.full((num_seqs, num_slots // block_size), -1, device=device)
        index = torch.arange(tables.shape[1], device=device).expand_as(tables)
        in_use = index < (-(-seq_lens.long() // block_size))[:, None]
        owner = torch.arange(num_seqs, device=device)[:, None].expand_as(tables)
        logical[owner[in_use], tables[in_use]] = index[in_use]

        def visible(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            block = logical[seq_of_row[q_idx], kv_idx // block_size]
            return (block >= 0) & (block * block_size + kv_idx % block_size <= row_pos[q_idx])

        mask = create_block_mask(
            visible,
            None,
            None,
            num_tokens,
            num_slots,
            device=device,
            _compile=device.type == "cuda",
        )
        return cls(mask)


def flex_paged_attention(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q: torch.Tensor,
    plan: FlexAttentionPlan,
    scale: float,
) -> torch.Tensor:
    """Attend after this step's k/v were written to the cache. q: [T, H, D] -> [T, H, D]."""
    with warnings.catch_warnings():  # eager off CUDA is on purpose (see the module docstring)
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        out = _flex(q.device)(
            q.transpose(0, 1).unsqueeze(0),
            k_cache.transpose(0, 1).unsqueeze(0),
            v_cache.transpose(0, 1).unsqueeze(0),
            block_mask=plan.block_mask,
            scale=scale,
            enable_gqa=True,
            kernel_options=_KERNEL_OPTIONS,
        )
    return out[0].transpose(0, 1)
