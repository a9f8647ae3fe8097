"""Where a batch of new-image requests spends its time, op by op (``torch.profiler``).

Loads one engine, warms it up on 2 requests, then profiles ``--requests`` requests of the reuse
workload at 0 % reuse (each a new image, 16 greedy tokens, all at once) and prints the ops with
the most self time. mmserve's CPU kernels are torch ops (``mmserve_avx512::bf16_dot_linear``,
``dense_attention_bf16``, ``paged_attention``), so the profile names them; self times are wall
time per op. For the real-size shapes: ``profile_reuse.py``'s cProfile categories do not find
these ops (a Qwen2-VL-2B run put 2 % of its time in their GEMM category).

    python benchmarks/profile_requests.py --model shape:Qwen2-VL-2B-Instruct --requests 6
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.workloads import reuse_specs, warmup_specs
from mmserve.bench.reuse.workload import Workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="shape:Qwen2-VL-2B-Instruct")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--width", type=int, default=448)
    parser.add_argument("--height", type=int, default=448)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Workload(args.model, (args.width, args.height))
    llm = LLM(model=args.model)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate(work.requests(warmup_specs(2)), params, use_tqdm=False)
    requests = work.requests(reuse_specs(args.requests, 0.0, True))
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(requests, params, use_tqdm=False)
    wall = time.perf_counter() - start
    ops = prof.key_averages()
    total = sum(op.self_cpu_time_total for op in ops)
    print(f"{args.requests} requests, {args.threads} threads: wall {wall:.1f} s,")
    print(f"self time {total / 1e6:.1f} s; ops by self time (s, share, calls):")
    for op in sorted(ops, key=lambda op: -op.self_cpu_time_total)[: args.top]:
        seconds = op.self_cpu_time_total / 1e6
        print(f"{seconds:8.2f} {op.self_cpu_time_total / total:6.1%} {op.count:6d}  {op.key}")


if __name__ == "__main__":
    main()
