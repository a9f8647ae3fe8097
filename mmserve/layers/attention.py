"""Paged KV cache tensors and attention over block tables (CPU-friendly, CUDA-compatible)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSegment:
    """Queries [q_start, q_start + q_len) of one request attending to its first ctx_len tokens."""

    q_start: int
    q_len: int
    key_slots: torch.Tensor  # [ctx_len] cache slots of positions 0..ctx_len-1
    causal_mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when q_len == ctx_len


@dataclass
class AttentionMetadata:
    """Everything a layer needs to write this step's K/V and attend over the paged cache."""

    slot_mapping: torch.Tensor  # [T] cache slot of each scheduled token
    prefills: list[PrefillSegment]
    decode_token_idx: torch.Tensor  # [D] flat index of each single-token (decode) request
    decode_key_slots: torch.Tensor  # [D, max_ctx] slots, padded with 0
    decode_mask: torch.Tensor  # [D, 1, 1, max_ctx] bool, True where the key is valid


class PagedKVCache:
    """K and V for every layer as [num_blocks * block_size, num_kv_heads, head_dim] tensors.

    Zero-initialised so padded gathers never read NaNs. Slot s belongs to block s // block_size.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes


def paged_attention(
    layer: int,
    cache: PagedKVCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write k/v of this step's tokens into the cache, then attend. q: [T, H, D] -> [T, H, D]."""
    k_cache, v_cache = cache.keys[layer], cache.values[layer]
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    for seg in meta.prefills:
        rows = slice(seg.q_start, seg.q_start + seg.q_len)
        qs = q[rows].transpose(0, 1)  # [H, q, D]
        if seg.causal_mask is None:  # nothing computed before: the keys are this step's own
            ks, vs = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ks = k_cache[seg.key_slots].transpose(0, 1)  # [KVH, ctx, D]
            vs = v_cache[seg.key_slots].transpose(0, 1)
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
    if meta.decode_token_idx.numel():
        qd = q[meta.decode_token_idx].unsqueeze(2)  # [D, H, 1, Dh]
        kd = k_cache[meta.decode_key_slots].transpose(1, 2)  # [D, KVH, ctx, Dh]
        vd = v_cache[meta.decode_key_slots].transpose(1, 2)
        o = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        out[meta.decode_token_idx] = o.squeeze(2)
    return out
