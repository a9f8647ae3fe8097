"""``mmserve bench replicas``: N engine replicas on a local Ray Serve, image-affinity vs
power-of-two routing, on a multi-image multi-turn chat workload.

Each configuration (``--configs 1:affinity,2:affinity,2:pow2``) is deployed on one local Ray
(127.0.0.1, ``--replica-cpus`` CPUs and torch threads per replica) and gets the same workload:
``--chats`` chats run concurrently, each adding one new image per turn for ``--turns`` turns and
then asking one text-only follow-up (history resent every turn, as chat clients do). Reported:
vision encodes per distinct image (1.0 = never twice), requests per replica (the load spread),
spills, wall time. Needs the ``mmserve[ray]`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from mmserve.bench.lib.images import png_data_url

RESOLUTION = (320, 240)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmserve bench replicas", description=__doc__)
    p.add_argument("--model", default="tiny-llava-small")
    p.add_argument("--configs", default="1:affinity,2:affinity,2:pow2", help="replicas:policy,...")
    p.add_argument("--chats", type=int, default=6)
    p.add_argument("--turns", type=int, default=3, help="turns adding an image (then 1 more)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--replica-cpus", type=float, default=1.0)
    p.add_argument("--load-factor", type=float, default=1.25)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument(
        "--encoder-store-redis",
        default=None,
        metavar="URL",
        help="replicas share this Redis as encoder store L3 (FLUSHed before each configuration)",
    )
    p.add_argument("--out", default="bench-out/replicas")
    return p


def _turn(chat: int, turn: int, turns: int) -> dict[str, Any]:
    text = {"type": "text", "text": f"Chat {chat}, turn {turn}: what is new here?"}
    if turn >= turns:
        return {"role": "user", "content": "Summarize everything you saw."}
    url = png_data_url(1000 * chat + turn, RESOLUTION)
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, text]}


async def _chat(client: httpx.AsyncClient, base: str, args: argparse.Namespace, c: int) -> int:
    history: list[dict[str, Any]] = []
    for turn in range(args.turns + 1):
        history.append(_turn(c, turn, args.turns))
        body = {
            "model": args.model,
            "messages": history,
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        r = await client.post(f"{base}/v1/chat/completions", json=body)
        r.raise_for_status()
        history.append(
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
        )
    return args.turns + 1


async def _workload(base: str, args: argparse.Namespace) -> int:
    async with httpx.AsyncClient(timeout=600) as client:
        done = await asyncio.gather(*(_chat(client, base, args, c) for c in range(args.chats)))
    return sum(done)


def run_config(replicas: int, policy: str, args: argparse.Namespace, port: int) -> dict[str, Any]:
    from ray import serve

    from mmserve.entrypoints.ray.app import build_app, namespace_from_config

    settings = {
        "model": args.model,
        "replicas": replicas,
        "routing": policy,
        "routing_load_factor": args.load_factor,
        "replica_cpus": args.replica_cpus,
        "max_num_seqs": args.max_num_seqs,
        "media_workers": 0,
    }
    if args.encoder_store_redis:
        import redis

        redis.Redis.from_url(args.encoder_store_redis).flushdb()
        settings["encoder_store_redis"] = args.encoder_store_redis
        settings["encoder_store_secret"] = "mmserve-bench-replicas-secret"
    name = f"bench-{replicas}-{policy}"
    serve.run(build_app(namespace_from_config(settings)), name=name, route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    try:
        start = time.perf_counter()
        requests = asyncio.run(_workload(base, args))
        wall = time.perf_counter() - start
        stats = httpx.get(f"{base}/cluster", timeout=120).json()
    finally:
        serve.delete(name)
    per_replica = sorted((s["requests"] for s in stats["replicas"].values()), reverse=True)
    encodes = int(stats["total"]["encoder_images_encoded"])
    loads = int(stats["total"].get("encoder_store_loads", 0))
    distinct = args.chats * args.turns
    return {
        "replicas": replicas,
        "policy": policy,
        "requests": requests,
        "distinct_images": distinct,
        "encodes": encodes,
        "encodes_per_distinct_image": encodes / distinct,
        "store_loads": loads,
        "requests_per_replica": per_replica,
        "decisions": stats["routing"]["decisions"],
        "peak_in_flight": stats["routing"]["peak_in_flight"],
        "wall_s": wall,
        "requests_per_s": requests / wall,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| replicas | routing | requests | encodes / distinct image | store loads"
        " | requests per replica | spills | wall s | req/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        spread = "/".join(map(str, r["requests_per_replica"]))
        lines.append(
            f"| {r['replicas']} | {r['policy']} | {r['requests']} |"
            f" {r['encodes']}/{r['distinct_images']} = {r['encodes_per_distinct_image']:.2f} |"
            f" {r['store_loads']} | {spread} | {r['decisions'].get('spill', 0)} |"
            f" {r['wall_s']:.1f} | {r['requests_per_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    import ray
    from ray import serve

    from mmserve.entrypoints.listen_port import free_port

    configs = [(int(n), p) for n, p in (c.split(":") for c in args.configs.split(","))]
    most = max(n for n, _ in configs)
    ray.init(
        num_cpus=int(most * args.replica_cpus + 0.999),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
    )
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        rows = [run_config(n, policy, args, port) for n, policy in configs]
    finally:
        serve.shutdown()
        ray.shutdown()
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "rows": rows}
    (out / "replicas.json").write_text(json.dumps(result, indent=2))
    return result
