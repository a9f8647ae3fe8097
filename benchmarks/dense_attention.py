"""The vision towers' attention in bfloat16 on CPU: mmserve's AVX-512 BF16 kernel
(``layers/dense_attention.py``) against torch's SDPA, at the towers' shapes, alternated rounds
in one process, medians (min-max) of milliseconds and GFLOP/s (4 x seq^2 x head_dim per head).
Run as root after ``echo -20 > /proc/self/autogroup``:

    python benchmarks/dense_attention.py --rounds 7
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mmserve.kernels import dense_attention_bf16_kernel

# name -> (batch, seq, heads, head_dim)
CASES: dict[str, tuple[int, int, int, int]] = {
    "Qwen2-VL-2B tower, one 448x448 image": (1, 1024, 16, 80),
    "SigLIP-so400m (LLaVA-OneVision), 2 tiles of 384x384": (2, 729, 16, 72),
    "CLIP ViT-L/14-336 (LLaVA-1.5), one image": (1, 577, 16, 64),
    "SigLIP-base (SmolVLM-256M), 5 tiles of 512x512": (5, 1024, 12, 64),
}


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = dense_attention_bf16_kernel()
    if kernel is None:
        raise SystemExit("no dense_attention_bf16 kernel here (AVX-512 BF16 build and CPU)")
    print("| case | kernel ms | GFLOP/s | SDPA ms | GFLOP/s |")
    print("|---|---|---|---|---|")
    for name, (batch, seq, heads, dim) in CASES.items():
        qkv = torch.randn(batch, seq, 3, heads, dim).to(torch.bfloat16)
        q, k, v = qkv.unbind(2)
        paths = {
            "kernel": functools.partial(kernel, q, k, v, dim**-0.5),
            "sdpa": functools.partial(sdpa, q, k, v),
        }
        times: dict[str, list[float]] = {path: [] for path in paths}
        for fn in paths.values():
            fn()  # warm-up
        for _ in range(args.rounds):
            for path, fn in paths.items():
                times[path].append(timed(fn))
        flops = 4 * batch * heads * seq * seq * dim
        cells = []
        for path in paths:
            ms = [t * 1e3 for t in times[path]]
            median = statistics.median(ms)
            cells.append(f"{median:.1f} ({min(ms):.1f}-{max(ms):.1f}) | {flops / median / 1e6:.0f}")
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
