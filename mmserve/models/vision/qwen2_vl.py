"""Qwen2-VL vision transformer: transformers' ``Qwen2VisionTransformerPretrainedModel`` with
transformers' parameter names (checkpoints load unchanged), computed more cheaply on CPU:

- the patch embedding is one matmul: the processor already flattens each patch to
  ``C*T*p*p`` values, and a Conv3d whose kernel equals its stride over such a patch is a Linear
  over that vector (the Conv3d weight viewed as ``[embed_dim, C*T*p*p]``, no copy);
- the 2-D rotary table is computed once per distinct image grid and forward pass, and q and k
  are rotated in one op on the fused qkv output;
- attention is varlen without a mask: each image (each frame of a video) attends only within
  itself; equal-length segments run as one batched SDPA call (torch's CPU flash kernel).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops, kernel_dtypes
from mmserve.layers.dense_attention import dense_attention
from mmserve.layers.linear import Linear
from mmserve.models.vision.clip import VisionMLP

Grid = tuple[int, int, int]  # (t, h, w) in patches


class PatchEmbed(nn.Module):
    """The Conv3d patch embedding run as a matmul over the processor's flat patches."""

    def __init__(self, config: Any, embed_dim: int | None = None) -> None:
        """``embed_dim``: the tower's width when the config does not call it ``embed_dim``."""
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.embed_dim = embed_dim or config.embed_dim
        # Kept as a Conv3d so the checkpoint's 5-D weight loads as is; run as a matmul.
        self.proj = nn.Conv3d(config.in_channels, self.embed_dim, kernel, kernel, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[patches, C*T*p*p] -> [patches, embed_dim]."""
        return F.linear(patches, self.proj.weight.view(self.embed_dim, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_half: torch.Tensor) -> torch.Tensor:
    """RoPE (``x * cos + rotate_half(x) * sin``) in two in-place halves, about half the time
    of the cat-based form. x: [T, heads, head_dim]; cos: [T, 1, head_dim]; sin_half:
    [T, 1, head_dim / 2] (both halves of the sin table are equal)."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin_half, value=-1)
    out[..., half:].addcmul_(x[..., :half], sin_half)
    return out


def rotate_heads(x: torch.Tensor, cos: torch.Tensor, sin_half: torch.Tensor) -> torch.Tensor:
    """``rotate`` of x [T, heads, head_dim] in float32, rounded once to x's dtype (transformers'
    ``apply_rotary_pos_emb_vision``): the CPU kernel in one pass where it applies (x may be a
    strided view of the fused qkv), else torch's ops."""
    cos2, sin2 = cos.view(x.shape[0], -1), sin_half.view(x.shape[0], -1)
    if (
        cpu_kernels_apply(cos2, sin2)
        and x.is_cpu
        and x.dtype in kernel_dtypes()
        and x.stride(-1) == 1
        and not (torch.is_grad_enabled() and x.requires_grad)
    ):
        return cpu_ops().rotary_embedding_float(x, cos2, sin2)
    return rotate(x.float(), cos, sin_half).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[tuple[int, int]]
    ) -> torch.Tensor:
        """``segments``: (count, length) runs of equal-length attention segments, in order."""
        n, heads, hd = x.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv(x).view(n, 3, heads, hd)
        qk = rotate_heads(qkv[:, :2].reshape(n, 2 * heads, hd), cos, sin)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, 2]
        outs, start = [], 0
        for count, length in segments:
            rows = slice(start, start + count * length)
            q_, k_, v_ = (t[rows].view(count, length, heads, hd) for t in (q, k, v))
            o = dense_attention(q_, k_, v_)  # [count, length, heads, hd]
            outs.append(o.reshape(count * length, heads * hd))
            start = rows.stop
        return self.proj(outs[0] if len(outs) == 1 else torch.cat(outs))


class VisionBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, config.num_heads)
        self.mlp = VisionMLP(dim, int(dim * config.mlp_ratio), config.hidden_act)

    def forward(self, x, cos, sin, segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, dim: int, context_dim: int, merge_size: int) -> None:
        super().__init__()
        self.hidden_size = context_dim * merge_size**2
        self.ln_q: nn.Module = nn.LayerNorm(context_dim, eps=1e-6)
        self.mlp = nn.Sequential(
            Linear(self.hidden_size, self.hidden_size),
            nn.GELU(),
            Linear(self.hidden_size, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.hidden_size))


class VisionRotaryEmbedding:
    """The 2-D rotary embedding of the Qwen-VL towers (no parameters): the first half of the
    rotated pairs turns with the patch row, the second with its column, in the block-major patch
    order of the processor."""

    def __init__(self, head_dim: int, theta: float, merge_size: int) -> None:
        self.head_dim, self.rope_theta, self.merge_size = head_dim, theta, merge_size

    def __call__(self, grids: Sequence[Grid], device: torch.device) -> tuple[torch.Tensor, ...]:
        """cos [patches, 1, head_dim] and sin [patches, 1, head_dim / 2] (float32). One table
        per distinct grid."""
        quarter = self.head_dim // 2
        exponents = torch.arange(0, quarter, 2, dtype=torch.float) / quarter
        inv_freq = (1.0 / self.rope_theta**exponents).to(device)
        tables: dict[Grid, torch.Tensor] = {}
        for grid in grids:
            if grid not in tables:
                freqs = self._positions(grid, device)[..., None].float() * inv_freq
                tables[grid] = freqs.flatten(1)  # [h-freqs, w-freqs]: half the head dim
        angles = torch.cat([tables[g] for g in grids]).unsqueeze(1)
        return angles.cos().repeat(1, 1, 2), angles.sin()

    def _positions(self, grid: Grid, device: torch.device) -> torch.Tensor:
        """(row, column) of each patch, [t*h*w, 2], in merge-block-major order."""
        t, h, w = grid
        m = self.merge_size
        rows, cols = torch.meshgrid(
            torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
        )
        block = (h // m, m, w // m, m)
        rows = rows.reshape(block).transpose(1, 2).flatten()
        cols = cols.reshape(block).transpose(1, 2).flatten()
        return torch.stack([rows, cols], dim=-1).repeat(t, 1)


class Qwen2VisionTransformer(nn.Module):
    """``forward(patches, grids)`` = transformers' ``Qwen2VisionTransformerPretrainedModel(
    patches, grid_thw).pooler_output``: one row per merge_size x merge_size block of patches."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.merge_size = config.spatial_merge_size
        theta = float((config.rope_parameters or {}).get("rope_theta", 10000.0))
        self.rotary = VisionRotaryEmbedding(
            config.embed_dim // config.num_heads, theta, self.merge_size
        )
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config.hidden_size, config.embed_dim, self.merge_size)

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        x = self.patch_embed(patches)
        cos, sin = self.rotary(grids, x.device)
        segments = _equal_runs([h * w for t, h, w in grids for _ in range(t)])
        for block in self.blocks:
            x = block(x, cos, sin, segments)
        return self.merger(x)


def _equal_runs(lengths: list[int]) -> list[tuple[int, int]]:
    """[3, 3, 5, 3] -> [(2, 3), (1, 5), (1, 3)]: consecutive equal lengths as (count, length)."""
    runs: list[tuple[int, int]] = []
    for length in lengths:
        if runs and runs[-1][1] == length:
            runs[-1] = (runs[-1][0] + 1, length)
        else:
            runs.append((1, length))
    return runs
