"""Single-request latency: one new image + question, greedy, mmserve vs transformers generate.
Interleaved per request (mmserve, transformers, mmserve, ...; the order flips every request);
medians with min-max and quartiles."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.engines.reference import HFReference
from mmserve.bench.lib.engines.runners import add_engine_args, processor_kwargs_for
from mmserve.bench.lib.harness import spread
from mmserve.bench.lib.images import RESOLUTIONS, synthetic_image
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, save
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.chat_utils import render_chat


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmserve bench latency", description=__doc__)
    add_engine_args(parser)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL pixel cap")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    priority = apply_priority(args)
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    # a new image every repetition: nothing is served from a cache
    images = [synthetic_image(100 + i, args.resolution) for i in range(args.repeats + 1)]
    llm = LLM(**EngineArgs.from_cli_args(args).as_kwargs(processor_kwargs=pkw))
    conv = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}],
        }
    ]
    prompt = render_chat(llm.get_tokenizer(), conv)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    ref = HFReference(args.model, pkw)
    timings: dict[str, list[float]] = {"mmserve": [], "transformers": []}

    def run_mmserve(image: Any) -> float:
        start = time.perf_counter()
        llm.generate({"prompt": prompt, "images": [image]}, params, use_tqdm=False)
        return time.perf_counter() - start

    def run_transformers(image: Any) -> float:
        start = time.perf_counter()
        ref.generate(ref.inputs(prompt, [image]), args.max_tokens, time.perf_counter)
        return time.perf_counter() - start

    runs = {"mmserve": run_mmserve, "transformers": run_transformers}
    for i, image in enumerate(images):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]
        took = {engine: runs[engine](image) for engine in order}
        if i:  # the first round is warm-up
            for engine, seconds in took.items():
                timings[engine].append(seconds)
    base = statistics.median(timings["mmserve"])
    rows = []
    for engine, values in timings.items():
        s = spread(values)
        rows.append(
            {
                "engine": engine,
                "median_s": s["median"],
                "min_s": s["min"],
                "max_s": s["max"],
                "iqr_s": f"{s['q1']:.4g}-{s['q3']:.4g}",
                "ratio": s["median"] / base,
            }
        )
    print(f"latency: {args.model}, {args.repeats} requests, {priority['effective']}")
    print(markdown_table(rows, ["engine", "median_s", "min_s", "max_s", "iqr_s", "ratio"]))
    path = save(
        "latency",
        args.out,
        {
            "args": vars(args),
            "versions": engine_versions(),
            "threads": threads_info(args.threads),
            "rows": rows,
            "timings": timings,
        },
    )
    print(f"results: {path}")
    return {"rows": rows, "path": str(path)}


if __name__ == "__main__":
    main()
