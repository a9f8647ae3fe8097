"""Qwen2.5-VL vision transformer: transformers' ``Qwen2_5_VisionTransformerPretrainedModel``
with transformers' parameter names (checkpoints load unchanged).

It is Qwen2-VL's tower (``qwen2_vl_vision``: matmul patch embedding, 2-D rotary, varlen SDPA
without a mask) with RMSNorm, a SwiGLU MLP with biases and *window attention*: the merged-patch
grid of each frame is cut into windows of ``window_size`` pixels (``window_size / patch /
merge`` merged patches a side, the right and bottom ones partial), and all layers except
``fullatt_block_indexes`` attend only within a window; those attend over the whole frame.

The patches are reordered once, merged patch by merged patch, so that every window is
contiguous (and every frame stays contiguous), run through all blocks and the merger, and the
merger's rows are put back into the processor's order. transformers orders the windows of a
frame row-major; here they are also grouped by size (full windows first, then the partial ones),
so equal windows run as one batched SDPA call. Attention within a window or a frame does not
depend on the order of its tokens (each carries its own rotary angles), so only the summation
order of the batched kernels differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mmserve.layers.norm import RMSNorm
from mmserve.models.llama import MLP
from mmserve.models.vision.qwen2_vl import (
    Grid,
    PatchEmbed,
    PatchMerger,
    VisionAttention,
    VisionRotaryEmbedding,
    _equal_runs,
)

Runs = list[tuple[int, int]]  # (count, length) of consecutive equal attention segments


@dataclass(frozen=True)
class WindowLayout:
    """Where each merged patch goes in window order, and the attention segments there.

    ``order[i]`` is the processor-order index of the merged patch at window-order slot ``i``;
    ``windows`` and ``frames`` are the segments (in patches) of window and full attention.
    """

    order: torch.Tensor
    windows: Runs
    frames: Runs


def window_layout(grids: Sequence[Grid], merge_size: int, window: int) -> WindowLayout:
    """The layout of a batch of (t, h, w) patch grids with ``window`` merged patches a side.
    Loops over images, never patches; one table per distinct grid."""
    tables: dict[Grid, tuple[torch.Tensor, list[int]]] = {}
    orders, window_lengths, frame_lengths = [], [], []
    start = 0
    unit = merge_size**2
    for grid in grids:
        if grid not in tables:
            tables[grid] = _frame_windows(grid[1] // merge_size, grid[2] // merge_size, window)
        frame_order, lengths = tables[grid]
        t, per_frame = grid[0], frame_order.numel()
        offsets = torch.arange(t).unsqueeze(1) * per_frame + start
        orders.append((frame_order + offsets).flatten())
        window_lengths += [n * unit for n in lengths] * t
        frame_lengths += [per_frame * unit] * t
        start += t * per_frame
    order = torch.cat(orders) if orders else torch.empty(0, dtype=torch.long)
    return WindowLayout(order, _equal_runs(window_lengths), _equal_runs(frame_lengths))


def _frame_windows(h: int, w: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """(processor-order index of each merged patch in window order, window sizes) of one
    h x w merged-patch frame: windows row-major within each size group, largest first."""
    rows, cols = -(-h // window), -(-w // window)
    index = torch.full((rows * window, cols * window), -1, dtype=torch.long)
    index[:h, :w] = torch.arange(h * w).view(h, w)
    index = index.view(rows, window, cols, window).transpose(1, 2).reshape(rows * cols, -1)
    sizes = (index >= 0).sum(1)
    by_size = torch.sort(sizes, descending=True, stable=True).indices
    index = index[by_size].flatten()
    return index[index >= 0], sizes[by_size].tolist()


class SwiGLUVisionBlock(nn.Module):
    """Pre-norm block: RMSNorm, attention over the given segments, RMSNorm, SwiGLU MLP."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        dim = config.hidden_size
        if config.hidden_act != "silu":
            raise ValueError(f"Qwen2.5-VL vision hidden_act {config.hidden_act!r} is not silu")
        self.norm1 = RMSNorm(dim, 1e-6)
        self.norm2 = RMSNorm(dim, 1e-6)
        self.attn = VisionAttention(dim, config.num_heads)
        self.mlp = MLP(dim, config.intermediate_size, bias=True)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Runs
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class RMSPatchMerger(PatchMerger):
    """Qwen2-VL's merger with an RMSNorm in place of its LayerNorm."""

    def __init__(self, dim: int, context_dim: int, merge_size: int) -> None:
        super().__init__(dim, context_dim, merge_size)
        self.ln_q = RMSNorm(context_dim, 1e-6)


class Qwen2_5VisionTransformer(nn.Module):
    """``forward(patches, grids)`` = transformers' ``Qwen2_5_VisionTransformerPretrainedModel(
    patches, grid_thw).pooler_output``: one row per merge_size x merge_size block of patches, in
    the processor's order."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.merge_size = config.spatial_merge_size
        self.window = config.window_size // config.spatial_merge_size // config.patch_size
        if self.window < 1:
            raise ValueError(f"window_size {config.window_size} is smaller than a merged patch")
        self.full_attention = frozenset(config.fullatt_block_indexes)
        dim = config.hidden_size
        theta = float((config.rope_parameters or {}).get("rope_theta", 10000.0))
        self.rotary = VisionRotaryEmbedding(dim // config.num_heads, theta, self.merge_size)
        self.patch_embed = PatchEmbed(config, dim)
        self.blocks = nn.ModuleList(SwiGLUVisionBlock(config) for _ in range(config.depth))
        self.merger = RMSPatchMerger(config.out_hidden_size, dim, self.merge_size)

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        layout = window_layout(grids, self.merge_size, self.window)
        order = layout.order.to(patches.device)
        x = self._to_windows(self.patch_embed(patches), order)
        cos, sin = (self._to_windows(t, order) for t in self.rotary(grids, x.device))
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, layout.frames if i in self.full_attention else layout.windows)
        merged = self.merger(x)
        out = torch.empty_like(merged)
        out[order] = merged
        return out

    def _to_windows(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Rows of ``x`` (one per patch, processor order) permuted merged patch by merged patch."""
        unit = self.merge_size**2
        return x.view(-1, unit, *x.shape[1:])[order].flatten(0, 1)
