"""The first image after start-up vs later ones: a fresh ``mmserve serve`` per run, then
``--images`` distinct 1280x720 JPEG images sent one after another (one output token each);
with the warm-up (the default) and with ``--skip-server-warmup``, interleaved round by round.

    python benchmarks/first_request.py [--model tiny-llava-small] [--rounds 4] [--threads 2]

Per variant: the median (min-max over rounds) of the first image's time, of the later images'
median, and of their ratio, plus the time from launch to a healthy /health. The issue's target:
the first new image takes at most 1.5x a later new image. Raises its own scheduling priority
when it can (``/proc/self/autogroup``, root only); every server gets ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np
from PIL import Image

from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.servers import free_port

VARIANTS = {"warm-up": [], "skip-server-warmup": ["--skip-server-warmup"]}


def image_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def one_run(model: str, flags: list[str], threads: int, seed: int, count: int) -> dict:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    argv = [sys.executable, "-m", "mmserve.cli", "serve", "--model", model, "--port", str(port)]
    server = subprocess.Popen(
        argv + flags, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base, started = f"http://127.0.0.1:{port}", time.perf_counter()
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        ready = time.perf_counter() - started
        urls = [image_url(seed * 100 + i) for i in range(count)]  # made before timing
        times = []
        for url in urls:
            image = {"type": "image_url", "image_url": {"url": url}}
            content = [image, {"type": "text", "text": "What is in the picture?"}]
            body = {"model": model, "messages": [{"role": "user", "content": content}],
                    "max_tokens": 1, "temperature": 0}  # fmt: skip
            t = time.perf_counter()
            r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
            times.append(time.perf_counter() - t)
            r.raise_for_status()
    finally:
        server.terminate()
        server.wait(60)
    later = statistics.median(times[1:])
    return {"ready_s": ready, "first_s": times[0], "later_s": later, "ratio": times[0] / later}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--images", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    add_priority_arg(parser)
    args = parser.parse_args()
    if args.rounds < 2 or args.images < 2:
        parser.error("--rounds and --images must be at least 2")
    print(apply_priority(args))
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_ in range(args.rounds):
        for name in names[round_ % 2 :] + names[: round_ % 2]:  # alternate who goes first
            runs[name].append(
                one_run(args.model, VARIANTS[name], args.threads, round_, args.images)
            )
    print(f"{args.model}, {args.rounds} rounds, {args.images} images, {args.threads} threads")
    print("| variant | ready s | first image s | later image s | first / later |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        cells = [summary([r[k] for r in rs]) for k in ("ready_s", "first_s", "later_s", "ratio")]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
