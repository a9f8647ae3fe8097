"""What the device can do at best, measured: memory bandwidth (a large device-to-device copy,
bytes read + written per second, as the device table of the workplace counts it) and the
half-precision matmul rate (square bfloat16 products). The benchmarks compare decode with
weight bytes / bandwidth and prefill with FLOPs / matmul rate."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work (CUDA; nothing to wait for on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls after two warm-up calls."""
    for _ in range(2):
        fn()
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Bytes read + written per second copying ``nbytes`` between two device buffers."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * nbytes / seconds


def matmul_rate(device: torch.device, size: int, dtype: torch.dtype, repeats: int = 10) -> float:
    """FLOP/s of ``size``-square products in ``dtype`` on random data."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    seconds = best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    return 2 * size**3 / seconds


def measure_limits(device: str, copy_bytes: int, matmul_size: int) -> dict[str, Any]:
    """The stage's result: bandwidth (GB/s) and bfloat16 matmul rate (TFLOP/s)."""
    dev = torch.device(device)
    bandwidth = copy_bandwidth(dev, copy_bytes)
    rate = matmul_rate(dev, matmul_size, torch.bfloat16)
    return {
        "copy_bytes": copy_bytes,
        "bandwidth_gb_s": bandwidth / 1e9,
        "matmul_size": matmul_size,
        "bf16_matmul_tflop_s": rate / 1e12,
    }
