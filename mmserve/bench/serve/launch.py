"""``mmserve bench serve --launch``: start each server per round (interleaved), run every
concurrency on the same salted workload, report medians with min-max per (server, concurrency)
and the throughput ratio to the first server (see ``serve``'s module doc)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from mmserve.bench.lib.engines.runners import processor_kwargs_for
from mmserve.bench.lib.harness import (
    contention_summary,
    fmt_spread,
    interleaved,
    is_contended,
    spread,
    uncontended,
    with_spread,
)
from mmserve.bench.lib.priority import apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, save
from mmserve.bench.lib.servers import ENGINES, start_server, vllm_checkpoint
from mmserve.bench.lib.workloads import WARMUP_RUN, warmup_specs, workload_kind, workload_specs
from mmserve.bench.serve.client import run_client, summarize

SPREAD_KEYS = ("req_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s")


def launch_main(args: argparse.Namespace) -> dict[str, Any]:
    """Start each server of ``--launch`` per round (interleaved) and run every concurrency."""
    engines = args.launch.split(",")
    for engine in engines:
        if engine not in ENGINES:
            raise SystemExit(f"unknown server {engine!r}: {', '.join(ENGINES)}")
    priority = apply_priority(args)
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    base_run = args.run if args.run is not None else int(time.time()) % 997 + 1
    out_dir = Path(args.out)
    logs = out_dir / "serve_logs"
    logs.mkdir(parents=True, exist_ok=True)
    extra = [a for arg in args.server_arg for a in shlex.split(arg)]
    versions = engine_versions(args.vllm_python if "vllm" in engines else None)
    server_start: dict[str, list[float]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-vllm-") as tmp:
        vllm_dir = None
        if "vllm" in engines:
            if not args.vllm_python:
                raise SystemExit("--launch vllm needs --vllm-python")
            vllm_dir = vllm_checkpoint(args.vllm_python, args.model, Path(tmp))

        def one_round(engine: str, rnd: int) -> dict[int, dict[str, Any]]:
            with open(logs / f"{engine}_round{rnd}.log", "w") as log:
                server = start_server(
                    engine,
                    args.model,
                    args.threads,
                    pkw,
                    log,
                    args.vllm_python,
                    vllm_dir,
                    extra if engine == "mmserve" else [],
                )
                server_start[engine].append(server.start_s)
                try:
                    ns = {**vars(args), "base_url": server.base_url, "served_model": args.model}
                    warm = argparse.Namespace(**{**ns, "concurrency": 2})
                    asyncio.run(run_client(warmup_specs(args.warmup_requests), warm))
                    by_c = {}
                    for i, concurrency in enumerate(args.concurrency):
                        one = argparse.Namespace(**{**ns, "concurrency": concurrency})
                        salt = base_run + rnd * 100 + i  # the same for every server of a round
                        specs = workload_specs(args, salt + (salt >= WARMUP_RUN) * 1000)
                        metered: dict[str, Any] = {}
                        results, wall, rates = asyncio.run(
                            run_client(specs, one, None, metered, server.proc.pid)
                        )
                        by_c[concurrency] = {
                            **summarize(results, wall, concurrency),
                            **rates,
                            "meter": metered,
                            "errors": [r["error"] for r in results if r["error"]][:3],
                        }
                finally:
                    server.stop()
            return by_c

        per_engine, order = interleaved(
            engines,
            args.rounds,
            one_round,
            contended=lambda by_c: is_contended(
                [r["meter"] for r in by_c.values()], args.max_others
            ),
            retries=args.retries,
        )
    rows = []
    for concurrency in args.concurrency:
        for engine in engines:
            every = [r[concurrency] for r in per_engine[engine]]
            runs = uncontended(every, [r["meter"] for r in every], args.max_others)
            row: dict[str, Any] = {"server": engine, "concurrency": concurrency}
            row["rounds"] = len(every)
            row["uncontended_rounds"] = sum(
                not is_contended(r["meter"], args.max_others) for r in every
            )
            for key in SPREAD_KEYS:
                with_spread(row, key, [r[key] for r in runs])
            row["req_per_s_spread"] = fmt_spread(row, "req_per_s")
            row["ttft_p50_spread"] = fmt_spread(row, "ttft_p50_s")
            row["failed"] = sum(r["failed"] for r in runs)
            for key in ("prefix_hit_rate", "encoder_hit_rate"):
                if key in runs[0]:
                    row[key] = spread([r[key] for r in runs])["median"]
            row.update(contention_summary([r["meter"] for r in runs]))
            rows.append(row)
        first = next(r for r in rows if r["concurrency"] == concurrency)
        for r in rows:
            if r["concurrency"] == concurrency:
                r["throughput_ratio"] = r["req_per_s"] / first["req_per_s"]
    columns = [
        "server",
        "concurrency",
        "req_per_s",
        "req_per_s_spread",
        "throughput_ratio",
        "ttft_p50_spread",
        "ttft_p99_s",
        "itl_p50_s",
        "failed",
        "prefix_hit_rate",
        "encoder_hit_rate",
        "uncontended_rounds",
        "others_cores_max",
    ]
    print(
        f"\nserve --launch: {args.model}, {args.requests} requests per run "
        f"({'zipf' if args.zipf else f'{args.reuse:.0%} reuse, ' + args.order}), "
        f"{args.resolution}, {args.threads} threads, {args.rounds} interleaved round(s), "
        f"{priority['effective']}"
    )
    print(markdown_table(rows, columns))
    name = f"serve_launch_{Path(args.model).name}_{workload_kind(args)}"
    path = save(
        name,
        out_dir,
        {
            "args": vars(args),
            "versions": versions,
            "threads": threads_info(args.threads),
            "round_order": order,
            "server_start_s": server_start,
            "rows": rows,
            "runs": {
                e: [{str(c): r for c, r in x.items()} for x in v] for e, v in per_engine.items()
            },
        },
    )
    print(f"results: {path}")
    return {"rows": rows, "path": str(path)}
