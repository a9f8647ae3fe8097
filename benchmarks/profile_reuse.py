"""Where mmserve's time goes on the reuse workload, by category.

Runs ``bench reuse``'s workload (same prompts, images, 16 greedy tokens, all requests at once) on
one engine under ``cProfile`` (timed in process CPU time) and prints each category's share of
the profiled time, from the functions' own time (``tottime``: torch ops, the compiled kernels
and PIL are C builtins called from Python, so each is counted once, where Python called it;
what is left is Python itself).
``torch.profiler`` would miss the paged-attention kernel, which is not a registered torch op.
One thread by default, so a busy neighbour cannot inflate one category through OpenMP barrier
waits: the shares are what one core spends, not a timing.

    python benchmarks/profile_reuse.py --reuse 0.3 --requests 100
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.workloads import reuse_specs, warmup_specs
from mmserve.bench.reuse.workload import Workload

CATEGORIES = {  # first match wins; cProfile function name -> category
    "GEMM (linear, mm, matmul)": ("._nn.linear", "method 'mm'", "torch.mm", "matmul", "addmm"),
    "LM paged attention (kernel)": ("paged_attention",),
    "vision attention (SDPA), conv": ("scaled_dot_product", "conv2d", "conv3d"),
    "norms, RoPE, activations": ("norm", "rotary", "silu", "gelu", "sigmoid", "softmax"),
    "image resize / decode (PIL)": ("ImagingCore", "ImagingDecoder", "ImagingEncoder", "PIL"),
    "hashing": ("blake3", "xxh", "hashlib"),
    "KV writes, copies, indexing": ("index_copy", "copy_", "index", "cat", "to'", "clone"),
    "tokenizer": ("tokenizers", "encode_batch"),
}


def category(name: str) -> str:
    for label, needles in CATEGORIES.items():
        if any(n in name for n in needles):
            return label
    return "other C calls" if name.startswith("{") else "Python (engine, scheduler, admission)"


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--reuse", type=float, default=0.0)
    parser.add_argument("--order", default="grouped", choices=("grouped", "shuffled"))
    parser.add_argument("--resolution", default="720p")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the shares as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Workload(args.model, args.resolution)
    llm = LLM(model=args.model)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate(work.requests(warmup_specs(8)), params, use_tqdm=False)
    requests = work.requests(reuse_specs(args.requests, args.reuse, args.order == "grouped"))
    profiler = cProfile.Profile(time.process_time)  # CPU time: robust to contention
    cpu, start = time.process_time(), time.perf_counter()
    profiler.enable()
    llm.generate(requests, params, use_tqdm=False)
    profiler.disable()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    by_category: dict[str, float] = defaultdict(float)
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (file, line, name), (_, _, tottime, _, _) in stats.items():
        label = name if file == "~" else f"{Path(file).name}:{line}({name})"
        by_category[category(label)] += tottime
    total = sum(by_category.values())
    shares = {k: v / total for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])}
    result = {"args": vars(args), "wall_s": wall, "cpu_s": cpu, "shares": shares}
    print(f"{args.requests} requests, {args.reuse:.0%} reuse, {args.threads} thread(s):")
    print(f"wall {wall:.2f} s, process CPU {cpu:.2f} s (wall >> CPU x threads: CPU contention)")
    for label, share in shares.items():
        print(f"  {share:6.1%}  {label}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
