"""Host -> device copies of encoder inputs and stored embeddings (they stay on the host until
their step)."""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``, dtype unchanged. To CUDA the copy leaves from pinned memory
    without blocking the host (a pinned tensor is used as is; the copy stays ordered before
    the kernels of the current stream that read it); on CPU it is ``host`` itself, no copy."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def to_device_like(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``host`` on ``like``'s device in its dtype. To CUDA the copy leaves from pinned memory
    without blocking the host (the cast runs on the device, after the copy, in stream order);
    on CPU it is a plain cast."""
    if like.device.type != "cuda":
        return host.to(dtype=like.dtype)
    return to_device(host, like.device).to(like.dtype)
