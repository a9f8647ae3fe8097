"""Rotary position embedding (RoPE): cos/sin tables, rotation, the config's theta."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops


class RotaryEmbedding(nn.Module):
    """Default RoPE: cos/sin per position computed in float32 exactly as HF does."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.theta = theta
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def apply_rope_to_heads_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """RoPE in place on heads [0, heads) of each row of ``x`` [T, width] (fused qkv rows: q's
    and k's heads lead). The CPU kernel rounds exactly as ``apply_rope``."""
    if cpu_kernels_apply(x, cos, sin):
        cpu_ops().rotary_embedding(x, heads, cos, sin)
        return
    dim = cos.shape[-1]
    qk = x[:, : heads * dim].view(x.shape[0], heads, dim)
    qk.copy_(apply_rope(qk, cos, sin))


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported yet (only 'default')")
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
