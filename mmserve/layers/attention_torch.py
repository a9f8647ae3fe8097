"""Pure-torch paged attention: gathers each sequence's keys and calls SDPA (the fallback where
the CPU kernel does not apply, e.g. on CUDA, in half precision or without a compiled kernel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSegment:
    """Queries [q_start, q_start + q_len) of one sequence attending to its first ctx_len keys."""

    q_start: int
    q_len: int
    key_slots: torch.Tensor  # [ctx_len] cache slots of positions 0..ctx_len-1
    causal_mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when q_len == ctx_len


@dataclass
class TorchAttentionPlan:
    """Prefill segments (one SDPA call each) and the decodes (one padded, masked SDPA call)."""

    prefills: list[PrefillSegment]
    decode_token_idx: torch.Tensor  # [D] flat row of each single-token (decode) sequence
    decode_key_slots: torch.Tensor  # [D, max_ctx] slots, padded with 0
    decode_mask: torch.Tensor  # [D, 1, 1, max_ctx] bool, True where the key is valid

    @classmethod
    def build(
        cls, block_tables: torch.Tensor, query_lens: list[int], seq_lens: list[int], bs: int
    ) -> TorchAttentionPlan:
        device = block_tables.device
        prefills: list[PrefillSegment] = []
        decode_idx: list[int] = []
        decode_slots: list[torch.Tensor] = []
        offset = 0
        for row, (n, total) in enumerate(zip(query_lens, seq_lens, strict=True)):
            pos = torch.arange(total, device=device)
            slots = block_tables[row, pos // bs] * bs + pos % bs
            start = total - n
            if n == 1 and start > 0:
                decode_idx.append(offset)
                decode_slots.append(slots)
            else:
                mask = None
                if start > 0:
                    q_pos = torch.arange(n, device=device)[:, None] + start
                    mask = q_pos >= pos[None, :]
                prefills.append(PrefillSegment(offset, n, slots, mask))
            offset += n
        max_ctx = max((s.numel() for s in decode_slots), default=0)
        key_slots = torch.zeros(len(decode_slots), max_ctx, dtype=torch.long, device=device)
        valid = torch.zeros(len(decode_slots), max_ctx, dtype=torch.bool, device=device)
        for i, s in enumerate(decode_slots):
            key_slots[i, : s.numel()] = s
            valid[i, : s.numel()] = True
        return cls(
            prefills,
            torch.tensor(decode_idx, dtype=torch.long, device=device),
            key_slots,
            valid[:, None, None, :],
        )


def torch_paged_attention(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: TorchAttentionPlan,
    scale: float,
) -> torch.Tensor:
    """Attend after this step's k/v were written to the cache. q: [T, H, D] -> [T, H, D]."""
    out = torch.empty_like(q)
    for seg in plan.prefills:
        rows = slice(seg.q_start, seg.q_start + seg.q_len)
        qs = q[rows].transpose(0, 1)  # [H, q, D]
        if seg.causal_mask is None:  # nothing computed before: the keys are this step's own
            ks, vs = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ks = k_cache.index_select(0, seg.key_slots).transpose(0, 1)  # [KVH, ctx, D]
            vs = v_cache.index_select(0, seg.key_slots).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qs.unsqueeze(0),
            ks.unsqueeze(0),
            vs.unsqueeze(0),
            attn_mask=seg.causal_mask,
            is_causal=seg.causal_mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o[0].transpose(0, 1)
    if plan.decode_token_idx.numel():
        shape = (*plan.decode_key_slots.shape, *k_cache.shape[1:])
        flat = plan.decode_key_slots.flatten()
        qd = q[plan.decode_token_idx].unsqueeze(2)  # [D, H, 1, Dh]
        kd = k_cache.index_select(0, flat).view(shape).transpose(1, 2)  # [D, KVH, ctx, Dh]
        vd = v_cache.index_select(0, flat).view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=plan.decode_mask, scale=scale, enable_gqa=True
        )
        out[plan.decode_token_idx] = o.squeeze(2)
    return out
