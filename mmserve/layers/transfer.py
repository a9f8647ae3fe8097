"""Host -> device copies of encoder inputs (pixels stay on the host until their encoder step)."""

from __future__ import annotations

import torch


def to_device_like(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``host`` on ``like``'s device in its dtype. To CUDA the copy leaves from pinned memory
    without blocking the host (the cast runs on the device, after the copy, in stream order);
    on CPU it is a plain cast."""
    if like.device.type != "cuda":
        return host.to(dtype=like.dtype)
    return host.pin_memory().to(like.device, non_blocking=True).to(like.dtype)
