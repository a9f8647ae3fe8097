"""Several Linear layers reading the same input, run as one GEMM (q/k/v, gate/up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinears:
    """Concatenates the layers' weights on first use (after loading) and makes each layer's
    parameters views of the concatenation, so memory is not doubled and later ``copy_`` loads
    into a layer still reach the fused weight. Re-fuses if the parameters were replaced (e.g.
    moved by ``.to()``). Layers must all have biases or none.

    Not an ``nn.Module``: the layers stay registered (and named) where their model put them.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self.split_sizes = [lin.out_features for lin in linears]
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def _fuse(self) -> None:
        biases = [lin.bias for lin in self.linears]
        with torch.no_grad():
            weight = torch.cat([lin.weight for lin in self.linears])
            bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
            for lin, w in zip(self.linears, weight.split(self.split_sizes), strict=True):
                lin.weight.data = w
            if bias is not None:
                for lin, b in zip(self.linears, bias.split(self.split_sizes), strict=True):
                    lin.bias.data = b
        self._weight, self._bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        first = self.linears[0].weight
        if self._weight is None or first.data_ptr() != self._weight.data_ptr():
            if len({lin.bias is None for lin in self.linears}) > 1:
                raise ValueError("FusedLinears needs biases on all layers or on none")
            self._fuse()
        assert self._weight is not None
        return F.linear(x, self._weight, self._bias)
