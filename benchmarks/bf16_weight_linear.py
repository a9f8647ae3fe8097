"""float32 products on bfloat16-valued weights: mmserve's packed-bfloat16 kernel
(``mmserve/layers/bf16_weights.py``) against oneDNN's packed float32 weights (what float32
linears run otherwise, ``mmserve/layers/linear.py``), the kernel's own weight widened per call
for ``torch.mm`` (its path from ``UNPACK_ROWS`` rows) and ``F.linear`` on the dense float32
weight, at the row counts of decode steps and prefill chunks.

The weights are one layer (``--layer``: by default the Qwen2-VL-2B shape's language model's
fused q/k/v, o, fused gate/up and down, 0.37 GB in float32 for two, so no cache holds them; or
a vision tower's) twice over, random values rounded to bfloat16. The paths alternate within
each of ``--rounds`` rounds; the table gives each path's median (min-max) GFLOP/s and the
weight bytes per second it read.
Run as root on a quiet machine after ``echo -20 > /proc/self/autogroup``:

    python benchmarks/bf16_weight_linear.py --threads 2 --rounds 5
    python benchmarks/bf16_weight_linear.py --rounds 7 --rows 1024,2048,4096 --layer qwen2-vl-2b-vit

``--paths kernel`` times the kernel alone, e.g. to compare two builds in alternated processes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from mmserve.kernels import cpu_ops
from mmserve.layers.bf16_weights import pack_bf16_exact

LAYERS = {  # (out, in) per linear: fused q/k/v, o, fused gate/up (or fc1), down (or fc2)
    "qwen2-vl-2b-lm": [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)],
    "qwen2-vl-2b-vit": [(3840, 1280), (1280, 1280), (5120, 1280), (1280, 5120)],
    "smolvlm-256m-vit": [(2304, 768), (768, 768), (3072, 768), (768, 3072)],
}


PATHS = {  # --paths name -> the table's name of the path
    "kernel": "bf16 kernel",
    "widened": "bf16 widened per call + oneDNN",
    "onednn": "oneDNN packed float32",
    "dense": "F.linear float32",
}


def widened_linear(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """What ``bf16_linear`` runs from ``UNPACK_ROWS`` rows: the weight widened, then ``mm``."""
    ops = cpu_ops()
    assert ops is not None
    tiles, k, tile = packed.shape
    widened = torch.empty(k, tiles * tile)
    ops.bf16_weight_unpack(packed, widened)
    return torch.mm(x, widened[:, :n])


def timed(run: Callable[..., Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="1,2,4,8,16,32,90,266,1024")
    parser.add_argument("--layer", choices=sorted(LAYERS), default="qwen2-vl-2b-lm")
    parser.add_argument(
        "--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}"
    )
    args = parser.parse_args()
    chosen = [PATHS[name] for name in args.paths.split(",")] if args.paths else []
    if not chosen or not set(chosen) <= set(PATHS.values()):
        parser.error(f"--paths: choose from {', '.join(PATHS)}")
    layer = LAYERS[args.layer]
    ops = cpu_ops()  # the kernel itself at every row count (bf16_linear widens from UNPACK_ROWS)
    assert ops is not None
    torch.set_num_threads(args.threads)
    weights = [torch.randn(n, k).bfloat16().float() for n, k in layer * 2]
    packed_bf16: list[torch.Tensor] = []
    for w in weights:
        packed = pack_bf16_exact(w)
        assert packed is not None  # rounded to bfloat16 above
        packed_bf16.append(packed)
    packed_onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 4) for w in weights]
    float32_bytes = sum(w.numel() * 4 for w in weights)
    print(f"{args.threads} threads, {torch.backends.cpu.get_cpu_capability()}")
    print("| rows | path | GFLOP/s | weight bytes read, GB/s |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k) for _, k in layer}
        flops = sum(2 * rows * w.numel() for w in weights)
        paths = {
            "bf16 kernel": (
                lambda xs=xs: [
                    ops.bf16_weight_linear(xs[w.shape[1]], p, None, w.shape[0])
                    for w, p in zip(weights, packed_bf16, strict=True)
                ],
                float32_bytes // 2,
            ),
            "bf16 widened per call + oneDNN": (
                lambda xs=xs: [
                    widened_linear(xs[w.shape[1]], p, w.shape[0])
                    for w, p in zip(weights, packed_bf16, strict=True)
                ],
                float32_bytes // 2,
            ),
            "oneDNN packed float32": (
                lambda xs=xs: [
                    torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                    for w, p in zip(weights, packed_onednn, strict=True)
                ],
                float32_bytes,
            ),
            "F.linear float32": (
                lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights],
                float32_bytes,
            ),
        }
        paths = {name: path for name, path in paths.items() if name in chosen}
        samples: dict[str, list[float]] = {name: [] for name in paths}
        for run, _ in paths.values():
            run()  # warm-up
        for _ in range(args.rounds):
            for name, (run, _) in paths.items():
                samples[name].append(timed(run))
        for name, (_, nbytes) in paths.items():
            rates = [flops / s / 1e9 for s in samples[name]]
            reads = [nbytes / s / 1e9 for s in samples[name]]
            print(
                f"| {rows} | {name} | {statistics.median(rates):.0f} ({min(rates):.0f}-"
                f"{max(rates):.0f}) | {statistics.median(reads):.1f} |"
            )


if __name__ == "__main__":
    main()
