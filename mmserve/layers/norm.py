"""RMSNorm, computed in float32 like HF's ``LlamaRMSNorm``; fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops


class RMSNorm(nn.Module):
    """RMSNorm; ``weight_offset`` is added to the stored weight to form the scale.

    With the default 0 the scale is ``weight`` and the normalized input is rounded to the
    input dtype before scaling (HF's ``LlamaRMSNorm``). With ``weight_offset=1.0`` (Gemma,
    whose checkpoints store the scale minus one) the scale ``1 + weight`` is applied in float32
    and the product rounded once, as HF's ``Gemma3RMSNorm`` does; the CPU kernel is not used.
    """

    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - weight_offset))
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_offset:
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (self.weight_offset + self.weight.float())).type_as(x)
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
        if not self.weight_offset and cpu_kernels_apply(residual, delta, self.weight):
            return residual, cpu_ops().add_rms_norm(residual, delta, self.weight, self.eps)
        residual = residual + delta
        return residual, self(residual)
