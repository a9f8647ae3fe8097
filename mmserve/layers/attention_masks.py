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


def window_start(first_pos: int, window: int | None) -> int:
    """The first key position any query at or after ``first_pos`` can see in a layer with
    this window (0 without one)."""
    return 0 if window is None else max(0, first_pos - window + 1)


def prefill_mask(
    first_pos: int,
    q_len: int,
    ctx_len: int,
    window: int | None,
    images: ImageRanges,
    device: torch.device,
    key_start: int = 0,
) -> torch.Tensor:
    """[q_len, ctx_len - key_start] bool, True where query ``first_pos + i`` may attend key
    ``key_start + j``."""
    q = torch.arange(first_pos, first_pos + q_len, device=device)[:, None]
    k = torch.arange(key_start, ctx_len, device=device)[None, :]
    allowed = k <= q
    for start, end in images:
        allowed |= (q >= start) & (q < end) & (k >= start) & (k < end)
    if window is not None:
        allowed &= k > q - window
    return allowed


def decode_window(
    key_slots: torch.Tensor, seq_lens: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``window`` keys of each decode row (whose query sits at position
    ``seq_len - 1``; decoded tokens are text, never inside an image).

    ``key_slots`` [D, max_ctx]: slots of positions 0.. of each row. Returns their slots
    [D, w] (w = min(window, max_ctx); a row shorter than w repeats its position 0) and
    [D, 1, 1, w] bool, True where the key is one of the row's."""
    width = min(window, key_slots.shape[1])
    pos = seq_lens[:, None] - width + torch.arange(width, device=key_slots.device)[None, :]
    valid = pos >= 0
    return key_slots.gather(1, pos.clamp(min=0)), valid[:, None, None, :]
