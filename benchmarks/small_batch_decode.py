"""Decode speed with and without the small-batch half-precision linear kernel (mmserve/layers/
linear.py), at batch 1 and 4, on a shape preset in bfloat16.

Each configuration runs in a fresh process; rounds interleave; the table gives medians (range)
of decode tokens per second per sequence and the weight-read rate they imply (the LM's weight
bytes per step over the step time). Run as root after ``echo -20 > /proc/self/autogroup``:

    python benchmarks/small_batch_decode.py --model shape:Qwen2-VL-2B-Instruct --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD_FLAG = "--child"


def child(model: str, kernel: bool, batch: int, tokens: int, threads: int) -> dict[str, float]:
    import torch

    from mmserve import LLM, SamplingParams
    from mmserve.layers.linear import Linear

    torch.set_num_threads(threads)
    llm = LLM(model=model, dtype="bfloat16", max_num_seqs=batch, max_model_len=1024)
    lm = llm.engine.model
    if not kernel:
        for module in lm.modules():
            if isinstance(module, Linear):
                module.small_batch = None
    weights = {  # the LM's matmul weights, each once (a tied lm_head is the embedding)
        m.weight.data_ptr(): m.weight.numel() * m.weight.element_size()
        for name, m in lm.named_modules()
        if isinstance(m, torch.nn.Linear) and "visual" not in name and "vision" not in name
    }
    weight_bytes = sum(weights.values())
    prompts = [{"prompt": f"Count to ten, attempt {i}:"} for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, one)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(prompts, params)
    decode = time.perf_counter() - start - prefill
    per_step = decode / (tokens - 1)
    return {"tok_s": 1 / per_step, "gb_s": weight_bytes / per_step / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shape:Qwen2-VL-2B-Instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument(CHILD_FLAG, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kernel, batch = args.child.split(",")
        result = child(args.model, kernel == "on", int(batch), args.tokens, args.threads)
        print(json.dumps(result))
        return
    configs = [(k, int(b)) for b in args.batches.split(",") for k in ("off", "on")]
    results: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for kernel, batch in configs:
            cmd = [sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens)]
            cmd += ["--threads", str(args.threads), CHILD_FLAG, f"{kernel},{batch}"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[(kernel, batch)].append(json.loads(out.strip().splitlines()[-1]))
    print("| batch | kernel | decode tok/s per sequence | weight read GB/s |")
    print("|---|---|---|---|")
    for (kernel, batch), runs in results.items():
        tok = [r["tok_s"] for r in runs]
        gbs = [r["gb_s"] for r in runs]
        print(
            f"| {batch} | {kernel} | {statistics.median(tok):.2f} ({min(tok):.2f}-{max(tok):.2f})"
            f" | {statistics.median(gbs):.1f} ({min(gbs):.1f}-{max(gbs):.1f}) |"
        )


if __name__ == "__main__":
    main()
