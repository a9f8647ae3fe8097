"""Encoder memory probe: one conversation adds an image per turn until --max-images, the RSS
limit or the context is reached. Per image count: images encoded that turn, the encoder's peak
memory (CUDA: ``max_memory_allocated``; CPU: peak RSS above the pre-call RSS, sampled every
0.5 ms during the encoder call), process RSS and the encoder-cache bytes metric. With the
per-image cache only the new image is encoded, so the encoder peak stays flat; with the caches
off every turn re-encodes all images (in batches up to the per-step encoder budget).

On CPU the glibc mmap threshold is fixed at 64 KiB (``mallopt``) so freed activations go back to
the OS and RSS tracks live tensors; ``--no-mallopt`` keeps the allocator as it is.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from typing import Any

import torch
from tqdm import tqdm

from mmserve.bench.lib.engines.runners import MmserveRunner, add_engine_args, processor_kwargs_for
from mmserve.bench.lib.images import RESOLUTIONS, png_bytes
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, plot_lines, save
from mmserve.engine.setup.malloc_tuning import set_malloc
from mmserve.engine_args import EngineArgs

MODES = {"mmserve": True, "mmserve-nocache": False}
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the lifetime peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fix_mmap_threshold(nbytes: int = 64 * 1024) -> bool:
    """Large blocks via mmap (returned on free), so RSS follows live tensors; the heap trimmed
    and padded as glibc's defaults do. Applied after each engine starts, after any engine-side
    ``MMSERVE_MALLOC_TUNING``. glibc only."""
    return set_malloc(nbytes, 128 * 1024, 128 * 1024)


class EncoderMeter:
    """Wraps ``model.encode_images`` (instance attribute, no engine change) to measure each call."""

    def __init__(self, model: Any, interval_s: float = 0.0005) -> None:
        self.model, self.interval = model, interval_s
        self.inner = model.encode_images
        self.calls: list[dict[str, Any]] = []
        model.encode_images = self

    def __call__(self, images: list[Any]) -> list[torch.Tensor]:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base_cuda = torch.cuda.memory_allocated()
        base = peak = rss_bytes()
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_bytes())
                time.sleep(self.interval)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            out = self.inner(images)
        finally:
            done.set()
            thread.join()
        peak = max(peak, rss_bytes())
        call = {"images": len(images), "rss_peak_delta": peak - base}
        if cuda:
            call["cuda_peak_delta"] = torch.cuda.max_memory_allocated() - base_cuda
        self.calls.append(call)
        return out


def probe_mode(mode: str, args: argparse.Namespace, pkw: dict[str, Any]) -> list[dict]:
    engine = EngineArgs.from_cli_args(args).as_kwargs(
        processor_kwargs=pkw, limit_mm_per_prompt={"image": args.max_images}
    )
    runner = MmserveRunner(engine.pop("model"), caches=MODES[mode], **engine)
    if args.mmap_fixed:  # after the engine's own malloc tuning
        fix_mmap_threshold()
    meter = EncoderMeter(runner.engine.model)
    warm = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": png_bytes(90_000, args.resolution)},
                {"type": "text", "text": "Warm-up."},
            ],
        }
    ]
    runner.chat_turn(warm, 2)  # first-call allocations are not the encoder's working set
    messages: list[dict[str, Any]] = []
    rows = []
    for n in tqdm(range(1, args.max_images + 1), desc=mode):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": png_bytes(n, args.resolution)},
                    {"type": "text", "text": f"And picture {n}?"},
                ],
            }
        )
        meter.calls.clear()
        try:
            result = runner.chat_turn(messages, args.answer_tokens)
        except ValueError as exc:  # the conversation no longer fits the context
            tqdm.write(f"{mode}: stopped before {n} images: {exc}")
            break
        messages.append({"role": "assistant", "content": result.answer})
        metrics = runner.engine.get_metrics()
        rss = rss_bytes()
        rows.append(
            {
                "mode": mode,
                "images": n,
                "prompt_tokens": result.prompt_tokens,
                "images_encoded": result.images_encoded,
                "max_images_per_call": max((c["images"] for c in meter.calls), default=0),
                "encoder_peak_mib": max(
                    (c.get("cuda_peak_delta", c["rss_peak_delta"]) for c in meter.calls), default=0
                )
                / 2**20,
                "encoder_s": result.encoder_s,
                "rss_mib": rss / 2**20,
                "encoder_cache_mib": metrics["encoder_cache_bytes"] / 2**20,
                "ttft_s": result.ttft_s,
            }
        )
        if args.max_rss_mib and rss / 2**20 > args.max_rss_mib:
            tqdm.write(f"{mode}: stopped at {n} images: RSS above {args.max_rss_mib} MiB")
            break
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_args(parser)
    parser.add_argument("--max-images", type=int, default=24)
    parser.add_argument("--max-rss-mib", type=float, default=None, help="stop above this RSS")
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--answer-tokens", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL pixel cap")
    parser.add_argument("--no-mallopt", action="store_true", help="keep glibc's mmap threshold")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    apply_priority(args)
    fixed = False if args.no_mallopt or torch.cuda.is_available() else fix_mmap_threshold()
    args.mmap_fixed = fixed
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    rows = []
    for mode in args.modes.split(","):
        rows += probe_mode(mode, args, pkw)
    columns = [
        "mode",
        "images",
        "prompt_tokens",
        "images_encoded",
        "max_images_per_call",
        "encoder_peak_mib",
        "encoder_s",
        "rss_mib",
        "encoder_cache_mib",
        "ttft_s",
    ]
    print(
        f"\nprobe: {args.model}, {args.resolution}, {args.threads} threads, "
        f"peak measure: {'cuda' if torch.cuda.is_available() else 'sampled RSS'}"
        f"{' (mmap threshold fixed)' if fixed else ''}"
    )
    print(markdown_table(rows, columns))
    summary = {}
    for mode in args.modes.split(","):
        peaks = [r["encoder_peak_mib"] for r in rows if r["mode"] == mode]
        if peaks:
            summary[mode] = {
                "images": len(peaks),
                "encoder_peak_first_mib": peaks[0],
                "encoder_peak_max_mib": max(peaks),
                "max_over_first": max(peaks) / max(peaks[0], 1e-9),
            }
            print(
                f"{mode}: {len(peaks)} images, encoder peak with 1 image {peaks[0]:.1f} MiB, "
                f"max {max(peaks):.1f} MiB ({summary[mode]['max_over_first']:.2f}x)"
            )
    name = f"probe_{os.path.basename(args.model)}_{args.resolution}"
    path = save(
        name,
        args.out,
        {
            "args": vars(args),
            "versions": engine_versions(),
            "threads": threads_info(args.threads),
            "mmap_threshold_fixed": fixed,
            "summary": summary,
            "rows": rows,
        },
    )
    series = {
        m: (
            [r["images"] for r in rows if r["mode"] == m],
            [r["encoder_peak_mib"] for r in rows if r["mode"] == m],
        )
        for m in args.modes.split(",")
    }
    plot_lines(
        path.with_suffix(".png"),
        f"encoder peak memory per turn ({args.model})",
        "images in the conversation",
        "encoder peak (MiB)",
        series,
    )
    print(f"results: {path}")
    return {"rows": rows, "summary": summary, "path": str(path)}


if __name__ == "__main__":
    main()
