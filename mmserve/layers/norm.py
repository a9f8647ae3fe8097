"""RMSNorm, computed in float32 like HF's ``LlamaRMSNorm``; fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_kernels_apply(x, self.weight):
            return cpu_ops().rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def add_and_norm(
        self, residual: torch.Tensor, delta: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + delta, its norm); the CPU kernel updates ``residual`` in place."""
        if cpu_kernels_apply(residual, delta, self.weight):
            return residual, cpu_ops().add_rms_norm(residual, delta, self.weight, self.eps)
        residual = residual + delta
        return residual, self(residual)
