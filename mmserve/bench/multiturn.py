"""Multi-turn image chat: each turn adds one new image; turn-N TTFT should stay flat when only
the new image is encoded (the per-image ViT cache experiment)."""

from __future__ import annotations

import argparse
import io
from typing import Any

import torch
from tqdm import tqdm

from mmserve.bench.images import RESOLUTIONS, synthetic_image
from mmserve.bench.report import markdown_table, plot_lines, save
from mmserve.bench.runners import make_runner

ENGINES = ["mmserve", "mmserve-nocache", "transformers"]


def _png_bytes(seed: int, resolution: str) -> bytes:
    buf = io.BytesIO()
    synthetic_image(seed, resolution).save(buf, format="PNG")
    return buf.getvalue()


def run_conversation(runner, turns: int, resolution: str, answer_tokens: int) -> list[dict]:
    messages: list[dict[str, Any]] = []
    rows = []
    for turn in tqdm(range(turns), desc=runner.name, leave=False):
        image = _png_bytes(turn, resolution)
        messages.append({"role": "user", "content": [
            {"type": "image", "image": image},
            {"type": "text", "text": f"What changed in picture {turn + 1}?"},
        ]})
        result = runner.chat_turn(messages, answer_tokens)
        messages.append({"role": "assistant", "content": result.answer})
        rows.append({"engine": runner.name, "turn": turn + 1, **vars(result)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="mmserve bench multiturn", description=__doc__)
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for kind in tqdm(args.engines.split(","), desc="engines"):
        runner = make_runner(kind, args.model)
        run_conversation(runner, 1, args.resolution, 2)  # warm-up on a separate chat
        runner = make_runner(kind, args.model) if kind != "transformers" else runner
        rows += run_conversation(runner, args.turns, args.resolution, args.answer_tokens)
        del runner
    first = args.engines.split(",")[0]
    base = {r["turn"]: r["ttft_s"] for r in rows if r["engine"] == first}
    for r in rows:
        r["ttft_ratio"] = r["ttft_s"] / base[r["turn"]]
    columns = ["engine", "turn", "ttft_s", "ttft_ratio", "encoder_s", "images_encoded",
               "prompt_tokens", "cached_tokens"]
    print(markdown_table(rows, columns))
    path = save("multiturn", args.out, {"args": vars(args), "rows": rows})
    series = {
        kind: ([r["turn"] for r in rows if r["engine"] == kind],
               [r["ttft_s"] for r in rows if r["engine"] == kind])
        for kind in args.engines.split(",")
    }
    plot_lines(path.with_suffix(".png"), f"multiturn TTFT ({args.model}, {args.resolution})",
               "turn", "TTFT (s)", series)
    print(f"results: {path}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
