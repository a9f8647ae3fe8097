"""Explicit attention masks for models the causal CPU kernel cannot run (Gemma 3): sliding
windows on local layers and bidirectional attention among one image's tokens.

Composition follows transformers' Gemma 3: a global layer lets query q see key k when
``k <= q`` or both lie in the same image; a local layer additionally requires
``k > q - window`` (the window cuts after the OR, so later tokens of q's own image stay
visible and earlier ones only within the window).
"""

from __future__ import annotations

import torch

ImageRanges = list[tuple[int, int]]  # absolute [start, end) positions of one sequence's images


def prefill_mask(
    first_pos: int,
    q_len: int,
    ctx_len: int,
    window: int | None,
    images: ImageRanges,
    device: torch.device,
) -> torch.Tensor:
    """[q_len, ctx_len] bool, True where query ``first_pos + i`` may attend key ``j``."""
    q = torch.arange(first_pos, first_pos + q_len, device=device)[:, None]
    k = torch.arange(ctx_len, device=device)[None, :]
    allowed = k <= q
    for start, end in images:
        allowed |= (q >= start) & (q < end) & (k >= start) & (k < end)
    if window is not None:
        allowed &= k > q - window
    return allowed


def decode_window_mask(valid: torch.Tensor, seq_lens: torch.Tensor, window: int) -> torch.Tensor:
    """``valid`` [D, 1, 1, ctx] narrowed to the last ``window`` keys of each decode row (whose
    query sits at position ``seq_len - 1``; decoded tokens are text, never inside an image)."""
    pos = torch.arange(valid.shape[-1], device=valid.device)
    recent = pos[None, :] > (seq_lens[:, None] - 1 - window)
    return valid & recent[:, None, None, :]
