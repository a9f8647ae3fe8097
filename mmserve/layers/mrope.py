"""Multimodal RoPE (M-RoPE, Qwen2-VL): 3-D position ids and the rotary embedding over them.

Every token has three position ids (temporal, height, width). Text tokens use the same value in
all three rows; the tokens of an image (one per merged patch, row-major over the merged grid)
get ``start + (t, h, w)`` where ``start`` is the position the image's first token would have had
as text; text after an image resumes at ``start + max(grid_h, grid_w)`` (merged units). This is
``transformers``' ``Qwen2VLModel.get_rope_index`` (videos: one span over all frame groups, the
temporal index scaled by Qwen2.5-VL's time interval), computed once per request with
tensor ops; a request's positions are then a slice of its table, and every position past the
table (generated tokens) is ``index + delta`` in all three rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmserve.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class MRopePositions:
    """The [3, n] position table of a request's first n tokens plus the decode offset."""

    table: torch.Tensor  # [3, n] int64
    delta: int  # position of token i >= n is i + delta (all three rows)

    def slice(self, start: int, end: int) -> torch.Tensor:
        """Positions [3, end - start] of tokens [start, end)."""
        n = self.table.shape[1]
        if end <= n:
            return self.table[:, start:end]
        tail = (torch.arange(max(start, n), end) + self.delta).expand(3, -1)
        if start >= n:
            return tail
        return torch.cat((self.table[:, start:], tail), dim=1)

    def at(self, index: int) -> list[int]:
        """The three positions of token ``index`` (``slice(index, index + 1)`` as ints)."""
        if index < self.table.shape[1]:
            return [int(p) for p in self.table[:, index]]
        return [index + self.delta] * 3


VisionSpan = tuple[int, tuple[int, int, int]] | tuple[int, tuple[int, int, int], float]


def mrope_positions(num_tokens: int, spans: Sequence[VisionSpan]) -> MRopePositions:
    """Positions of a sequence of ``num_tokens`` tokens with the given images and videos.

    ``spans``: (offset of the first placeholder token, (t, h, w) grid in merged units[, time
    interval]) per image or whole video; each occupies t * h * w consecutive tokens. Temporal
    index i sits at ``start + int(i * interval)`` (interval in float32: Qwen2.5-VL's
    ``tokens_per_second * second_per_grid_t`` for videos, else 1). Text after a span resumes
    at ``start + max(h, w)``, as transformers' ``get_rope_index`` has it; generated tokens
    continue from the last text position + 1 as transformers' ``generate`` does (not from the
    table's maximum, which a video's temporal positions can exceed). Loops over spans, never
    tokens.
    """
    table = torch.empty(3, num_tokens, dtype=torch.long)
    shift = 0  # position minus token index for the current text run
    cursor = 0
    for offset, (t, h, w), *interval in sorted(spans, key=lambda span: span[0]):
        length = t * h * w
        if offset < cursor or offset + length > num_tokens:
            raise ValueError(f"image at {offset} (+{length}) overlaps another or the end")
        table[:, cursor:offset] = torch.arange(cursor + shift, offset + shift)
        start = offset + shift
        temporal = torch.arange(t)
        if interval and interval[0] != 1:
            temporal = (temporal * torch.tensor(interval[0], dtype=torch.float32)).long()
        grid = torch.stack(
            torch.meshgrid(temporal, torch.arange(h), torch.arange(w), indexing="ij")
        )
        table[:, offset : offset + length] = grid.reshape(3, -1) + start
        cursor = offset + length
        shift = start + max(h, w) - cursor
    table[:, cursor:] = torch.arange(cursor + shift, num_tokens + shift)
    return MRopePositions(table, shift)


class MRotaryEmbedding(RotaryEmbedding):
    """RoPE whose frequency bands take their angle from one of the three position rows.

    ``mrope_section`` splits the head_dim / 2 frequencies into (temporal, height, width) bands,
    exactly as ``transformers``' ``Qwen2VLRotaryEmbedding`` (bit-identical in float32). 1-D
    positions (text only) give the default RoPE.
    """

    def __init__(self, head_dim: int, theta: float, mrope_section: Sequence[int]) -> None:
        super().__init__(head_dim, theta)
        if sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {list(mrope_section)} must sum to {head_dim // 2}")
        self.mrope_section = [int(s) for s in mrope_section]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        if positions.ndim == 1:
            return super().forward(positions, dtype)
        freqs = positions.float()[..., None] * self.inv_freq  # [3, T, head_dim / 2]
        bands = freqs.split(self.mrope_section, dim=-1)
        freqs = torch.cat([band[i % 3] for i, band in enumerate(bands)], dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
