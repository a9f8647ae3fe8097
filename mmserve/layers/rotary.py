"""Rotary position embedding (RoPE): cos/sin tables, rotation, the config's theta."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops


class RotaryEmbedding(nn.Module):
    """RoPE: cos/sin per position computed in float32 exactly as HF does. ``linear_factor``
    divides the frequencies (HF's ``linear`` rope type); 1 is the default RoPE. The frequencies
    are a non-persistent buffer, so they move with the module; ``inverse_frequencies``
    rebuilds them after a model is built on the meta device."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, linear_factor: float = 1.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.linear_factor = linear_factor
        self.register_buffer("inv_freq", self.inverse_frequencies(), persistent=False)

    def inverse_frequencies(self, device: torch.device | None = None) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float()
        return 1.0 / (self.theta ** (exponents / self.head_dim)) / self.linear_factor

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


def rotary_from_parameters(head_dim: int, params: dict[str, Any]) -> RotaryEmbedding:
    """The RoPE of one HF ``rope_parameters`` entry: ``default`` or ``linear`` (``factor``)."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "linear"):
        raise ValueError(f"rope type {rope_type!r} is not supported (default, linear)")
    factor = float(params.get("factor", 1.0)) if rope_type == "linear" else 1.0
    return RotaryEmbedding(head_dim, float(params["rope_theta"]), factor)


def rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported yet (only 'default')")
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
