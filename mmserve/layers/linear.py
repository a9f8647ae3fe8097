"""The language model's Linear layer: torch's GEMM, except for decode-sized inputs in half
precision on CPU, where mmserve's small-batch kernel reads the weights at close to memory speed
(torch's bfloat16 matmul streams a 1-row input's weights at half of it, and an 8-row input's
at a tenth, one row after another)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels import small_batch_linear_kernel

HALF_DTYPES = (torch.bfloat16, torch.float16)


class Linear(nn.Linear):
    """``nn.Linear`` that sends inputs of at most ``small_batch_rows`` rows to
    ``small_batch``, once ``use_small_batch_kernel`` has set it.

    Invariant: ``small_batch`` is set only on a module whose weight (and bias) is a contiguous
    CPU bfloat16/float16 tensor, and runs only with autograd off; float32 always runs
    ``F.linear``, the op transformers runs, so float32 stays token-identical to it.
    """

    small_batch: Callable[..., torch.Tensor] | None = None
    small_batch_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.small_batch
        if kernel is not None and x.dim() == 2 and x.shape[0] <= self.small_batch_rows:
            if not torch.is_grad_enabled():  # the kernel has no backward
                return kernel(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_small_batch_kernel(model: nn.Module) -> int:
    """Enable the small-batch kernel on every ``Linear`` of ``model`` it applies to (see the
    class invariant); returns how many. 0 without a kernel build or off the CPU or in float32."""
    kernel = small_batch_linear_kernel()
    if kernel is None:
        return 0
    function, rows = kernel
    enabled = 0
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        params = [module.weight] + ([module.bias] if module.bias is not None else [])
        if module.weight.dtype in HALF_DTYPES and all(
            p.device.type == "cpu" and p.dtype == module.weight.dtype and p.is_contiguous()
            for p in params
        ):
            module.small_batch, module.small_batch_rows = function, rows
            enabled += 1
    return enabled
