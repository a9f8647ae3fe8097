"""Interleaved M-RoPE (Qwen3-VL): the three position rows take turns frequency by frequency.

Qwen2-VL's ``MRotaryEmbedding`` gives each row one contiguous band of frequencies (temporal
first, then height, then width). Qwen3-VL interleaves them: frequency ``j`` turns with the
height row when ``j % 3 == 1`` and ``j < 3 * mrope_section[1]``, with the width row when
``j % 3 == 2`` and ``j < 3 * mrope_section[2]``, and with the temporal row otherwise. This is
``transformers``' ``Qwen3VLTextRotaryEmbedding`` (a selection of the same float32 angles, so
bit-identical). The positions themselves are Qwen2-VL's (``mmserve.layers.mrope``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmserve.layers.rotary import RotaryEmbedding


class InterleavedMRotaryEmbedding(RotaryEmbedding):
    """RoPE over [3, T] positions whose frequencies alternate t, h, w (see the module)."""

    def __init__(self, head_dim: int, theta: float, mrope_section: Sequence[int]) -> None:
        super().__init__(head_dim, theta)
        half = head_dim // 2
        if sum(mrope_section) != half:
            raise ValueError(f"mrope_section {list(mrope_section)} must sum to {half}")
        self.mrope_section = [int(s) for s in mrope_section]
        # built on first use: models are constructed on the meta device
        self._rows: torch.Tensor | None = None

    def row_of_frequency(self, device: torch.device) -> torch.Tensor:
        """[head_dim / 2]: the position row (0 t, 1 h, 2 w) each frequency turns with."""
        if self._rows is None or self._rows.device != device:
            rows = torch.zeros(self.inv_freq.numel(), dtype=torch.long, device=device)
            rows[1 : 3 * self.mrope_section[1] : 3] = 1
            rows[2 : 3 * self.mrope_section[2] : 3] = 2
            self._rows = rows
        return self._rows

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        if positions.ndim == 1:
            return super().forward(positions, dtype)
        freqs = positions.float()[..., None] * self.inv_freq  # [3, T, head_dim / 2]
        index = self.row_of_frequency(freqs.device).expand(1, freqs.shape[1], -1)
        freqs = freqs.gather(0, index)[0]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
