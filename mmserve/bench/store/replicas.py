"""``mmserve bench store --replicas``: ``bench serve`` against mmserve replicas, one after
another on the same salted workload: A and B share one Redis (B should encode nothing A
encoded), C runs without a store (the baseline a new replica pays today)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from mmserve.bench.lib.report import markdown_table, save
from mmserve.bench.lib.servers import start_server
from mmserve.bench.serve import run as serve

REPLICAS = (
    ("A: store (Redis), first", True),
    ("B: store, shares A's Redis", True),
    ("C: no store", False),
)


def replicas_main(args: argparse.Namespace, redis_url: str, secret: str) -> dict[str, Any]:
    store_flags = ["--encoder-store-redis", redis_url, "--encoder-store-secret", secret]
    client = serve.build_parser().parse_args(
        ["--zipf", "--distinct", str(args.images), "--requests", str(4 * args.images),
         "--concurrency", "4", "--resolution", args.resolution, "--max-tokens", "8",
         "--no-raise-priority", "--out", str(Path(args.out) / "store_replicas")]
    )  # fmt: skip
    run = int.from_bytes(os.urandom(2), "big") % 997 + 1  # one workload salt for all replicas
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as logs:
        for name, with_store in REPLICAS:
            with open(Path(logs) / f"{len(rows)}.log", "w") as log:
                server = start_server(
                    "mmserve", args.model, os.cpu_count() or 1, {}, log,
                    extra_args=store_flags if with_store else [],
                )  # fmt: skip
                try:
                    one = argparse.Namespace(**{**vars(client), "base_url": server.base_url})
                    summary = serve.client_run(one, 4, run)["summary"]
                finally:
                    server.stop()
            rows.append({"replica": name, **summary})
    columns = ["replica", "requests", "failed", "images_encoded", "ttft_p50_s", "ttft_p90_s",
               "req_per_s"]  # fmt: skip
    print(markdown_table(rows, columns))
    print(f"wrote {save('store_replicas', args.out, {'rows': rows, 'args': vars(args)})}")
    return {"failed": any(row["failed"] for row in rows), "rows": rows}
