"""Image/prefix reuse: R requests, a fraction repeating an earlier image and text prefix;
throughput, TTFT and hit rates with the caches on vs off (multimodal prefix caching experiment).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.images import RESOLUTIONS, synthetic_image
from mmserve.bench.report import markdown_table, save

MODES: dict[str, dict[str, Any]] = {
    "caches-on": {},
    "prefix-off": {"enable_prefix_caching": False},
    "caches-off": {"enable_prefix_caching": False, "enable_encoder_cache": False},
}
TOPICS = ["a harbour", "a market", "a forest trail", "a kitchen", "a train station", "a garden"]


def build_workload(
    num_requests: int, reuse: float, grouped: bool, resolution: str, seed: int
) -> list[dict]:
    """Requests as (prefix id, image id, question); repeats copy an earlier prefix + image."""
    rng = random.Random(seed)
    specs: list[tuple[int, int]] = []
    fresh = 0
    for _ in range(num_requests):
        if specs and rng.random() < reuse:
            specs.append(rng.choice(specs))
        else:
            specs.append((fresh, fresh))
            fresh += 1
    if grouped:
        specs.sort(key=lambda s: s[0])
    else:
        rng.shuffle(specs)
    images = {i: synthetic_image(i, resolution) for i in {s[1] for s in specs}}
    requests = []
    for n, (prefix, image) in enumerate(specs):
        system = (f"You are looking at photo number {prefix} taken near {TOPICS[prefix % 6]}. "
                  "Answer briefly and precisely about shapes, colors and text. ")
        prompt = f"{system}USER: <image>\nQuestion {n}: what stands out? ASSISTANT:"
        requests.append({"prompt": prompt, "images": [images[image]]})
    return requests


def run_mode(model: str, mode: str, requests: list[dict], max_tokens: int) -> dict[str, Any]:
    llm = LLM(model, **MODES[mode])
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(requests[:2], params, use_tqdm=False)  # warm-up
    before = llm.get_metrics()
    start = time.perf_counter()
    outs = llm.generate(requests, params, use_tqdm=True)
    wall = time.perf_counter() - start
    m = llm.get_metrics()
    ttfts = sorted(o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outs)
    delta = {k: m[k] - before[k] for k in m}
    enc_lookups = delta["encoder_cache_hits"] + delta["encoder_cache_misses"]
    return {
        "mode": mode,
        "wall_s": wall,
        "req_per_s": len(outs) / wall,
        "out_tok_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall,
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_p50_s": ttfts[len(ttfts) // 2],
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        "prefix_hit_rate": delta["prefix_cache_hits"] / max(delta["prefix_cache_queries"], 1),
        "encoder_hit_rate": delta["encoder_cache_hits"] / max(enc_lookups, 1),
        "images_encoded": delta["encoder_images_encoded"],
        "encoder_s": delta["encoder_seconds"],
        "outputs": [o.outputs[0].token_ids for o in outs],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="mmserve bench reuse", description=__doc__)
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--reuse", type=float, default=0.3, help="fraction of repeats (0..1)")
    parser.add_argument("--order", choices=["grouped", "shuffled"], default="grouped")
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--modes", default="caches-on,caches-off")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    requests = build_workload(
        args.requests, args.reuse, args.order == "grouped", args.resolution, args.seed
    )
    rows = [run_mode(args.model, mode, requests, args.max_tokens) for mode in args.modes.split(",")]
    same = all(r["outputs"] == rows[0]["outputs"] for r in rows)
    for r in rows:
        r["throughput_ratio"] = r["req_per_s"] / rows[0]["req_per_s"]
        r.pop("outputs")
    columns = ["mode", "req_per_s", "throughput_ratio", "out_tok_per_s", "ttft_mean_s",
               "ttft_p50_s", "ttft_p99_s", "prefix_hit_rate", "encoder_hit_rate",
               "images_encoded", "encoder_s"]
    print(markdown_table(rows, columns))
    print(f"identical outputs across modes: {same}")
    name = f"reuse_{int(args.reuse * 100)}pct_{args.order}"
    path = save(name, args.out, {"args": vars(args), "rows": rows, "identical_outputs": same})
    print(f"results: {path}")
    return {"rows": rows, "identical": same}


if __name__ == "__main__":
    main()
