"""Which torch device the engine runs on: ``--device auto|cpu|cuda[:N]``."""

from __future__ import annotations

import torch

from mmserve.config import check_device_syntax


def resolve_device(requested: str) -> str:
    """``auto`` is the current CUDA device when torch sees one, else ``cpu``; ``cuda`` and
    ``cuda:N`` must name a device that exists (ValueError naming the value otherwise). The
    result is ``cpu`` or ``cuda:N``."""
    check_device_syntax(requested)
    if requested == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if requested == "auto":
        return f"cuda:{torch.cuda.current_device()}" if available else "cpu"
    if not available:
        raise ValueError(f"device {requested!r}: torch sees no CUDA device")
    index = int(requested.partition(":")[2] or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"device {requested!r}: only {torch.cuda.device_count()} CUDA device(s) present"
        )
    return f"cuda:{index}"
