"""Decode attention at a fixed shape, for CUDA graphs: one query per row over a fixed number
of key positions, gathered through the block table and masked by each row's length.

Every shape depends only on the bucket (rows B, key positions C), never on the lengths, and
nothing reads a value on the host, so a graph captured once replays for any lengths <= C.
The query heads that share a KV head become that head's query rows (SDPA without
``enable_gqa``, whose kernel support varies): one decode query sees the same keys from each
of its heads, so the mask is per row, not per query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StaticDecodePlan:
    """The keys of B decode rows at positions 0..C-1, built once per forward for every layer.

    Row b's query sits at position ``seq_lens[b] - 1`` and sees positions ``< seq_lens[b]``.
    Invariants: ``seq_lens >= 1`` (no row without a key: no NaN), and the block tables hold a
    real block id in every column (past a row's blocks: any block, e.g. the pad block), so the
    gather never reads outside the cache; positions past a row's length are masked.
    """

    key_slots: torch.Tensor  # [B * C] long: cache slot of each row's position 0..C-1
    visible: torch.Tensor  # [B, 1, 1, C] bool: True where the row's query sees the key
    num_keys: int  # C

    @classmethod
    def build(
        cls, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int
    ) -> StaticDecodePlan:
        """``block_tables`` [B, C / block_size] long, ``seq_lens`` [B] long (device tensors)."""
        num_keys = block_tables.shape[1] * block_size
        pos = torch.arange(num_keys, device=block_tables.device)
        slots = block_tables[:, pos // block_size] * block_size + pos % block_size
        visible = pos[None, :] < seq_lens[:, None]
        return cls(slots.flatten(), visible[:, None, None, :], num_keys)


def static_decode_attention(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q: torch.Tensor,
    plan: StaticDecodePlan,
    scale: float,
) -> torch.Tensor:
    """Attend after this step's k/v were written to the cache. q: [B, H, D] -> [B, H, D]."""
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    shape = (rows, plan.num_keys, kv_heads, dim)
    k = k_cache.index_select(0, plan.key_slots).view(shape).transpose(1, 2)  # [B, KVH, C, D]
    v = v_cache.index_select(0, plan.key_slots).view(shape).transpose(1, 2)
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)  # a KV head's queries as rows
    out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=plan.visible, scale=scale)
    return out.reshape(rows, heads, dim)
