"""Pass the image once (issue 31): turn-1 time with the image encoded ahead vs sent with the
question, and the request bytes of a multi-turn chat that refers to its image by handle vs one
that resends it as a data URL every turn.

    python benchmarks/encode_ahead.py [--model tiny-llava-small] [--rounds 3] [--images 4]
        [--serve-args "--max-model-len 4096"]

Per round a fresh ``mmserve serve``; each of ``--images`` distinct 1280x720 JPEG images is asked
about once per mode, the modes alternating which goes first:
- ``sent``: one chat request carrying the image (a data URL);
- ``encoded ahead``: ``POST /v1/mm/encode`` with the image (untimed: a client does it while the
  person types), then the chat request naming ``mmserve://<handle>``.
Each timed request asks for one token, so its time is the turn's time to first token. The table
prints medians (min-max) over all images of all rounds. The byte count is exact (JSON bodies of
an ``--turns``-turn chat resending its history each turn, as OpenAI clients do). Raises its own
scheduling priority when it can (``/proc/self/autogroup``, root only).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shlex
import statistics
import tempfile
import time
from typing import Any

import httpx
import numpy as np
from PIL import Image

from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.servers import start_server

QUESTION = "What is in the picture?"


def image_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(model: str, url: str) -> dict[str, Any]:
    content = [image_part(url), {"type": "text", "text": QUESTION}]
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 1, "temperature": 0}  # fmt: skip


def encode(base: str, model: str, url: str) -> str:
    r = httpx.post(f"{base}/mm/encode", json={"model": model, "content": [image_part(url)]},
                   timeout=600)  # fmt: skip
    r.raise_for_status()
    return str(r.json()["items"][0]["handle"])


def timed_chat(base: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    r = httpx.post(f"{base}/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - t
    r.raise_for_status()
    return elapsed, r.json()


def one_round(
    model: str, threads: int, seed: int, count: int, extra: list[str]
) -> dict[str, list[float]]:
    urls = [image_url(seed * 100 + i) for i in range(count)]  # made before timing
    with tempfile.TemporaryDirectory() as tmp, open(f"{tmp}/server.log", "w") as log:
        server = start_server("mmserve", model, threads, {}, log, extra_args=extra,
                              timeout_s=1800)  # fmt: skip
        try:
            times = asked(server.base_url, model, urls, seed)  # base_url ends in /v1
        finally:
            server.stop()
    return times


def asked(base: str, model: str, urls: list[str], seed: int) -> dict[str, list[float]]:
    """Each image asked about once per mode, the modes alternating which goes first."""
    times: dict[str, list[float]] = {"sent": [], "encoded ahead": []}
    for i, url in enumerate(urls):
        for mode in ["sent", "encoded ahead"] if i % 2 == 0 else ["encoded ahead", "sent"]:
            if mode == "sent":  # another image: the other mode's encode must not serve it
                elapsed, _ = timed_chat(base, chat_body(model, image_url(seed * 100 + i + 50)))
            else:
                handle = encode(base, model, url)
                elapsed, answer = timed_chat(base, chat_body(model, f"mmserve://{handle}"))
                sources = [m["source"] for m in answer["usage"].get("mm_inputs", [])]
                if "encoded" in sources:
                    raise RuntimeError(f"the handle's image was encoded again: {sources}")
            times[mode].append(elapsed)
    return times


def chat_bytes(model: str, url: str, turns: int) -> list[int]:
    """Body size of each turn of a chat about one image whose client resends the history."""
    messages: list[dict[str, Any]] = []
    sizes = []
    for turn in range(turns):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"{QUESTION} ({turn})"}]
        if turn == 0:
            content.insert(0, image_part(url))
        messages.append({"role": "user", "content": content})
        sizes.append(len(json.dumps({"model": model, "messages": messages, "max_tokens": 32})))
        messages.append({"role": "assistant", "content": "A picture of noise, " * 4})
    return sizes


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-args", default="", help="more `mmserve serve` flags")
    add_priority_arg(parser)
    args = parser.parse_args()
    print(apply_priority(args))
    extra = shlex.split(args.serve_args)
    times: dict[str, list[float]] = {"sent": [], "encoded ahead": []}
    for round_ in range(args.rounds):
        for mode, values in one_round(args.model, args.threads, round_, args.images, extra).items():
            times[mode].extend(values)
    print(f"{args.model}, {args.rounds} rounds x {args.images} images, {args.threads} threads")
    print("| turn 1 | time to first token s |")
    print("|---|---|")
    for mode, values in times.items():
        print(f"| image {mode} | {summary(values)} |")
    url = image_url(0)
    by_url = chat_bytes(args.model, url, args.turns)
    by_handle = chat_bytes(args.model, "mmserve://" + "0" * 64, args.turns)
    print(f"\n{args.turns}-turn chat, bytes per request (1280x720 JPEG q90 image):")
    print("| turn | data URL every turn | handle |")
    print("|---|---|---|")
    for turn, (a, b) in enumerate(zip(by_url, by_handle, strict=True), start=1):
        print(f"| {turn} | {a} | {b} |")
    print(f"| all | {sum(by_url)} | {sum(by_handle)} |")


if __name__ == "__main__":
    main()
