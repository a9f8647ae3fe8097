"""Pure-torch paged attention: gathers each sequence's keys and calls SDPA (the fallback where
the CPU kernel does not apply, e.g. on CUDA, in half precision or without a compiled kernel),
and the only path for models with explicit masks (``attention_masks``: sliding windows,
bidirectional image attention)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mmserve.layers.attention_masks import ImageRanges, decode_window, prefill_mask, window_start


def is_decode_row(query_len: int, seq_len: int) -> bool:
    """Whether a sequence's rows in a step are a decode: one query after earlier keys. Such rows
    attend in one batched call (this path's padded SDPA)."""
    return query_len == 1 and seq_len > 1


@dataclass
class PrefillSegment:
    """Queries [q_start, q_start + q_len) of one sequence attending to its first ctx_len keys."""

    q_start: int
    q_len: int
    key_slots: torch.Tensor  # [ctx_len] cache slots of positions 0..ctx_len-1
    causal_mask: torch.Tensor | None  # [q_len, ctx_len] bool, None when q_len == ctx_len
    first_pos: int = 0  # position of query 0 (= ctx_len - q_len)
    images: ImageRanges | None = None  # bidirectional image ranges (models that declare them)


@dataclass
class KeyView:
    """The keys one kind of layer reads in a step: per prefill segment, the cache slots to
    gather (None: the segment's keys are this step's own k/v) and its mask over them; the
    decodes' slots [D, ctx] and mask [D, 1, 1, ctx]."""

    prefill_slots: list[torch.Tensor | None]
    prefill_masks: list[torch.Tensor | None]
    decode_slots: torch.Tensor
    decode_mask: torch.Tensor


@dataclass
class TorchAttentionPlan:
    """Prefill segments (one SDPA call each) and the decodes (one padded, masked SDPA call).

    The keys and masks for a sliding window or image ranges are built on first use per window
    size and shared by every layer of that kind in the step: a layer with a window gathers
    only the keys its queries can see (the last ``window`` before the segment, and the
    segment's). Without either the plan is the causal one.
    """

    prefills: list[PrefillSegment]
    decode_token_idx: torch.Tensor  # [D] flat row of each single-token (decode) sequence
    decode_key_slots: torch.Tensor  # [D, max_ctx] slots, padded with 0
    decode_mask: torch.Tensor  # [D, 1, 1, max_ctx] bool, True where the key is valid
    decode_seq_lens: torch.Tensor | None = None  # [D] keys of each decode row
    _views: dict[int | None, KeyView] = field(default_factory=dict)

    def view(self, window: int | None) -> KeyView:
        """The keys and masks of layers with this window (None: global layers)."""
        if window not in self._views:
            self._views[window] = self._build_view(window)
        return self._views[window]

    def _build_view(self, window: int | None) -> KeyView:
        slots: list[torch.Tensor | None] = []
        masks: list[torch.Tensor | None] = []
        for seg in self.prefills:
            own_keys = seg.causal_mask is None  # nothing computed before: first_pos == 0
            start = window_start(seg.first_pos, window)
            slots.append(None if own_keys else seg.key_slots[start:])
            if window is None and not seg.images:
                masks.append(seg.causal_mask)
            else:
                ctx_len = seg.key_slots.numel()
                device = seg.key_slots.device
                images = seg.images or []
                masks.append(
                    prefill_mask(seg.first_pos, seg.q_len, ctx_len, window, images, device, start)
                )
        if window is None or self.decode_seq_lens is None:
            return KeyView(slots, masks, self.decode_key_slots, self.decode_mask)
        decode_slots, decode_mask = decode_window(
            self.decode_key_slots, self.decode_seq_lens, window
        )
        return KeyView(slots, masks, decode_slots, decode_mask)

    @classmethod
    def build(
        cls,
        block_tables: torch.Tensor,
        query_lens: list[int],
        seq_lens: list[int],
        bs: int,
        image_ranges: list[ImageRanges] | None = None,
    ) -> TorchAttentionPlan:
        device = block_tables.device
        prefills: list[PrefillSegment] = []
        decode_idx: list[int] = []
        decode_slots: list[torch.Tensor] = []
        decode_lens: list[int] = []
        offset = 0
        for row, (n, total) in enumerate(zip(query_lens, seq_lens, strict=True)):
            pos = torch.arange(total, device=device)
            slots = block_tables[row, pos // bs] * bs + pos % bs
            start = total - n
            if is_decode_row(n, total):
                decode_idx.append(offset)
                decode_slots.append(slots)
                decode_lens.append(total)
            else:
                mask = None
                if start > 0:
                    q_pos = torch.arange(n, device=device)[:, None] + start
                    mask = q_pos >= pos[None, :]
                images = image_ranges[row] if image_ranges is not None else None
                prefills.append(PrefillSegment(offset, n, slots, mask, start, images))
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
            torch.tensor(decode_lens, dtype=torch.long, device=device),
        )


def torch_paged_attention(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: TorchAttentionPlan,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attend after this step's k/v were written to the cache. q: [T, H, D] -> [T, H, D]."""
    out = torch.empty_like(q)
    view = plan.view(sliding_window)
    for seg, slots, mask in zip(plan.prefills, view.prefill_slots, view.prefill_masks, strict=True):
        rows = slice(seg.q_start, seg.q_start + seg.q_len)
        qs = q[rows].transpose(0, 1)  # [H, q, D]
        if slots is None:
            ks, vs = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ks = k_cache.index_select(0, slots).transpose(0, 1)  # [KVH, ctx, D]
            vs = v_cache.index_select(0, slots).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qs.unsqueeze(0),
            ks.unsqueeze(0),
            vs.unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o[0].transpose(0, 1)
    if plan.decode_token_idx.numel():
        shape = (*view.decode_slots.shape, *k_cache.shape[1:])
        flat = view.decode_slots.flatten()
        qd = q[plan.decode_token_idx].unsqueeze(2)  # [D, H, 1, Dh]
        kd = k_cache.index_select(0, flat).view(shape).transpose(1, 2)  # [D, KVH, ctx, Dh]
        vd = v_cache.index_select(0, flat).view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=view.decode_mask, scale=scale, enable_gqa=True
        )
        out[plan.decode_token_idx] = o.squeeze(2)
    return out
