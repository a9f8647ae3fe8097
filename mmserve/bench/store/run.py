"""The encoder store: per-tier lookup cost, and re-encodes + TTFT after a restart and on a
second replica, with and without the store.

``--replicas``: ``bench serve`` against replicas sharing Redis instead (``store.replicas``).

Part 1 (``tiers``): one value at a time, N rounds interleaved over the tiers, the cost of a
lookup as the engine pays it (read + MAC + decode): L1 host RAM, L2 local disk (warm page
cache), L3 Redis over loopback (hiredis), for the model's embedding and a 4.5 MiB one
(576 x 4096 float16, LLaVA-1.5-7B's). Part 2 (``restart``): D distinct images, one request
each (max_tokens=1, so a request's latency is its TTFT), on a fresh engine that encodes and
writes the store, then on fresh engines: without the store (a plain restart), with the same
disk directory (a restart), and with only the shared Redis (a second replica).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.harness import spread
from mmserve.bench.lib.images import synthetic_image
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.report import markdown_table, save
from mmserve.store.codec import StoreCodec
from mmserve.store.disk import DiskTier
from mmserve.store.ram import RamTier
from mmserve.store.redis_tier import RedisTier

SECRET = "mmserve-bench-store-secret"
ISSUE_SHAPE = (576, 4096)  # 4.5 MiB in float16


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmserve bench store", description=__doc__)
    p.add_argument("--model", default="tiny-llava-small")
    p.add_argument("--images", type=int, default=8, help="distinct images (one request each)")
    p.add_argument("--resolution", default="720p")
    p.add_argument("--rounds", type=int, default=200, help="lookups per tier and size")
    p.add_argument("--redis", default=None, help="redis:// URL (default: start redis-server)")
    p.add_argument("--out", default="bench-results")
    p.add_argument(
        "--replicas", action="store_true",
        help="instead: bench serve against replicas sharing Redis and one without a store",
    )  # fmt: skip
    add_priority_arg(p)
    return p.parse_args(argv)


def _ms(values: list[float]) -> str:
    s = spread([v * 1000 for v in values])
    return f"{s['median']:.3g} ({s['q1']:.3g}-{s['q3']:.3g})"


def tier_costs(shape: tuple[int, int], dtype: torch.dtype, url: str | None, rounds: int):
    """Per tier: seconds to read one value and to verify + decode it, ``rounds`` times
    (tiers interleaved within a round). L1 holds tensors: nothing to decode."""
    codec = StoreCodec(SECRET.encode(), dtype)
    tensor = torch.randn(shape).to(dtype)
    key = os.urandom(32).hex()
    blob = codec.encode(key, tensor)
    ram = RamTier(1 << 30)
    ram.put(key, tensor)
    with tempfile.TemporaryDirectory() as tmp:
        disk = DiskTier(tmp, 1 << 30)
        disk.put(key, blob)
        tiers: dict[str, Any] = {"L1 ram": ram, "L2 disk": disk}
        if url is not None:
            tiers["L3 redis"] = redis = RedisTier(url, 600, 5.0)
            redis.put(key, blob)
        reads: dict[str, list[float]] = {name: [] for name in tiers}
        decodes: dict[str, list[float]] = {name: [] for name in tiers}
        for _ in range(rounds):
            for name, tier in tiers.items():
                start = time.perf_counter()
                value = tier.get(key)
                middle = time.perf_counter()
                if name != "L1 ram":
                    codec.decode(key, value, shape[0])
                end = time.perf_counter()
                reads[name].append(middle - start)
                decodes[name].append(end - middle)
    return len(blob), reads, decodes


def run_requests(llm: LLM, images: list[Any]) -> dict[str, Any]:
    params = SamplingParams(temperature=0, max_tokens=1)
    prompt = "USER: <image>\nDescribe it. ASSISTANT:"
    latencies, answers = [], []
    for image in images:
        start = time.perf_counter()
        out = llm.generate([{"prompt": prompt, "images": [image]}], params, use_tqdm=False)[0]
        latencies.append(time.perf_counter() - start)
        answers.append(out.outputs[0].token_ids)
    llm.engine.close()
    metrics = llm.get_metrics()
    held = list(llm.engine.runner.encoder.embeddings.values())
    return {
        "embedding_shape": tuple(held[0].shape) if held else None,
        "encodes": int(metrics["encoder_images_encoded"]),
        "loads": int(metrics["encoder_store_loads"]),
        "ttft_s": statistics.median(latencies),
        "ttft": _ms(latencies),
        "answers": answers,
        "metrics": metrics,
    }


def restart(model: str, images: list[Any], url: str | None) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store: dict[str, Any] = {"encoder_store_dir": tmp, "encoder_store_secret": SECRET}
        if url is not None:
            store["encoder_store_redis"] = url
        cases: list[tuple[str, dict[str, Any]]] = [
            ("first start, store on (encodes, writes)", store),
            ("restart without the store", {}),
            ("restart with the store (L2 disk)", {**store, "encoder_store_redis": None}),
        ]
        if url is not None:
            shared = {"encoder_store_redis": url, "encoder_store_secret": SECRET}
            cases.append(("second replica sharing Redis (L3 only)", shared))
        reference = None
        for name, kwargs in cases:
            result = run_requests(LLM(model, **kwargs), images)
            reference = reference or result["answers"]
            rows.append({"run": name, **result, "same_answers": result["answers"] == reference})
    return rows


def start_redis() -> tuple[Any, str] | tuple[None, None]:
    import shutil
    import socket
    import subprocess

    binary = shutil.which("redis-server")
    if binary is None:
        return None, None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port, socket_timeout=1)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    priority = apply_priority(args)
    proc, url = (None, args.redis) if args.redis else start_redis()
    if args.replicas:
        from mmserve.bench.store.replicas import replicas_main

        if url is None:
            raise SystemExit("--replicas needs redis-server or --redis URL")
        try:
            return replicas_main(args, url, SECRET)
        finally:
            if proc is not None:
                proc.kill()
    try:
        images = [synthetic_image(1000 + i, args.resolution) for i in range(args.images)]
        runs = restart(args.model, images, url)
        emb_shape = runs[0]["embedding_shape"]
        tier_rows = []
        for label, shape, dtype in (
            (f"{args.model} embedding", emb_shape, torch.float32),
            ("4.5 MiB (576x4096 fp16)", ISSUE_SHAPE, torch.float16),
        ):
            size, reads, decodes = tier_costs(shape, dtype, url, args.rounds)
            for tier, read in reads.items():
                total = [a + b for a, b in zip(read, decodes[tier], strict=True)]
                tier_rows.append({"value": label, "bytes": size, "tier": tier,
                                  "lookup ms": _ms(total), "read ms": _ms(read),
                                  "verify+decode ms": _ms(decodes[tier]),
                                  "median_ms": statistics.median(total) * 1000})  # fmt: skip
    finally:
        if proc is not None:
            proc.kill()
    columns = ["value", "bytes", "tier", "lookup ms", "read ms", "verify+decode ms"]
    print(markdown_table(tier_rows, columns))
    print()
    print(markdown_table(runs, ["run", "encodes", "loads", "ttft", "same_answers"]))
    for run in runs:
        del run["answers"]
    path = save("store", args.out, {"tiers": tier_rows, "restart": runs, "priority": priority,
                                    "args": vars(args)})  # fmt: skip
    print(f"wrote {path}")
    return {"failed": not all(run["same_answers"] for run in runs)}
