"""The ``bench serve`` client: OpenAI chat completions streamed over httpx (SSE), at most
``--concurrency`` requests in flight, TTFT / ITL stamped per content delta."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx
from tqdm import tqdm

from mmserve.bench.lib.engines.meter import Meter
from mmserve.bench.lib.images import png_data_url
from mmserve.bench.lib.server_metrics import cache_rates, scrape_metrics
from mmserve.bench.lib.workloads import Spec, latency_summary


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
