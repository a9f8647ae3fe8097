"""The FLOP floor of the reuse workload: how far each engine is from the machine's GEMM rate.

- **FLOPs per request**: counted with ``torch.utils.flop_counter.FlopCounterMode`` while the
  transformers reference serves one request of the workload (encode its image, prefill the
  prompt, decode ``--max-tokens`` - 1 steps with a KV cache): the matrix work any engine must
  do, independent of mmserve's kernels. Elementwise ops are not counted. Vision-tower layers
  after the one LLaVA reads (``vision_feature_layer``) are left out: no engine needs them.
- **GEMM rate**: the best of repeated fp32 ``torch.mm`` at the model's own shapes (a step's
  tokens x hidden -> MLP / QKV widths), with ``--threads`` threads, in GFLOP/s. The best of
  many trials, so a neighbour's burst lowers it only if it lasts the whole measurement.
- **Floor**: GEMM rate / FLOPs per request, in requests/s. With ``--reuse-json`` (a
  ``bench reuse`` result), each engine's ``floor / req_per_s``: its time per request as a
  multiple of the floor (1.0 = every FLOP at GEMM peak).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.lib.engines.meter import Meter
from mmserve.bench.lib.engines.runners import processor_kwargs_for
from mmserve.bench.lib.harness import is_contended
from mmserve.bench.lib.images import RESOLUTIONS, synthetic_image
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, save
from mmserve.bench.lib.workloads import Spec, reuse_specs


def count_request_flops(
    model: str,
    resolution: str | tuple[int, int],
    max_tokens: int,
    pkw: dict[str, Any],
    spec: Spec | None = None,
) -> dict:
    """FLOPs of one request (``spec``, default the reuse workload's first) on the transformers
    reference (see module doc)."""
    from torch.utils.flop_counter import FlopCounterMode

    from mmserve.bench.lib.engines.reference import HFReference
    from mmserve.entrypoints.chat_utils import render_chat

    ref = HFReference(model, pkw)
    spec = spec or reuse_specs(1, 0.0, True)[0]
    prompt = render_chat(ref.tokenizer, spec.messages({"type": "image"}))
    inputs = ref.inputs(prompt, [synthetic_image(spec.image_seed, resolution)])
    counter = FlopCounterMode(display=False)
    with counter:
        ref.generate(inputs, max_tokens, time.perf_counter)
    counts = counter.get_flop_counts()
    total = sum(counts["Global"].values())
    vision_total, skipped = 0, 0
    config = ref.model.config
    feature_layer = getattr(config, "vision_feature_layer", None)
    vision_layers = getattr(getattr(config, "vision_config", None), "num_hidden_layers", 0)
    needed = None
    if isinstance(feature_layer, int) and vision_layers:
        # hidden_states[0] is the embeddings: index k (or -k) needs layers [0, k)
        needed = feature_layer if feature_layer >= 0 else vision_layers + 1 + feature_layer
    # FlopCounterMode names modules by the path it saw them under; a vision tower called from
    # inside the VLM shows up under its class name (CLIPVisionModel.encoder.layers.3, ...)
    vision = re.compile(r"(Vision|vision_tower|visual)", re.IGNORECASE)
    layer = re.compile(r"\.(?:layers|blocks)\.(\d+)$")
    for name, ops in counts.items():
        if name != "Global" and "." not in name and vision.search(name):
            vision_total += sum(ops.values())
        match = layer.search(name) if vision.search(name.split(".")[0]) else None
        if match and needed is not None and int(match.group(1)) >= needed:
            skipped += sum(ops.values())
    return {
        "flops_counted": total,
        "flops_vision": vision_total,
        "flops_skippable_vision_layers": skipped,
        "flops_per_request": total - skipped,
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "max_tokens": max_tokens,
    }


def gemm_rate(shapes: list[tuple[int, int, int]], seconds: float = 3.0) -> dict[str, Any]:
    """Best fp32 GFLOP/s of ``torch.mm`` over ``shapes`` (M, K, N), each timed repeatedly."""
    best: dict[str, float] = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        out = torch.empty(m, n)
        for _ in range(3):
            torch.mm(a, b, out=out)
        deadline = time.perf_counter() + seconds / len(shapes)
        fastest = float("inf")
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            fastest = min(fastest, time.perf_counter() - t0)
        best[f"{m}x{k}x{n}"] = 2 * m * k * n / fastest / 1e9
    return {"gflops_by_shape": best, "gflops": max(best.values())}


def lm_shapes(model: str, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of the text model's projections for a step of ``tokens`` tokens."""
    from mmserve.models.tiny import resolve_model_path

    config = json.loads((resolve_model_path(model) / "config.json").read_text())
    text = config.get("text_config", config)
    hidden, inter = int(text["hidden_size"]), int(text["intermediate_size"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    kv = int(text.get("num_key_value_heads", heads))
    qkv = (heads + 2 * kv) * head_dim
    return [(tokens, hidden, inter), (tokens, inter, hidden), (tokens, hidden, qkv)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="tiny-llava-small")
    parser.add_argument("--resolution", default="720p", choices=sorted(RESOLUTIONS))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-pixels", type=int, default=None, help="Qwen2-VL pixel cap")
    parser.add_argument("--step-tokens", type=int, default=2048, help="M of the GEMM shapes")
    parser.add_argument("--gemm-seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reuse-json", default=None, help="a bench reuse result to compare")
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    apply_priority(args)
    pkw = processor_kwargs_for(args.model, args.max_pixels)
    flops = count_request_flops(args.model, args.resolution, args.max_tokens, pkw)
    meter = Meter()
    rate = gemm_rate(lm_shapes(args.model, args.step_tokens), args.gemm_seconds)
    rate["meter"] = meter.stop()
    if is_contended(rate["meter"]):
        print(
            f"warning: other processes took {rate['meter']['others_cores']:.2f} cores while the "
            "GEMM rate was measured: it (and so the floor) is low"
        )
    floor_rps = rate["gflops"] * 1e9 / flops["flops_per_request"]
    rows = []
    if args.reuse_json and Path(args.reuse_json).exists():
        reuse = json.loads(Path(args.reuse_json).read_text())
        for r in reuse["rows"]:
            rows.append(
                {
                    "engine": r["engine"],
                    "req_per_s": r["req_per_s"],
                    "floor_req_per_s": floor_rps,
                    "time_over_floor": floor_rps / r["req_per_s"],
                }
            )
    print(
        f"\nfloor: {args.model}, {args.resolution}, {flops['prompt_tokens']} prompt tokens + "
        f"{args.max_tokens} generated: {flops['flops_per_request'] / 1e9:.2f} GFLOP per request "
        f"(vision {flops['flops_vision'] / 1e9:.2f}, of which "
        f"{flops['flops_skippable_vision_layers'] / 1e9:.2f} in layers past the feature layer, "
        f"left out); fp32 GEMM {rate['gflops']:.0f} GFLOP/s on {args.threads} threads "
        f"-> floor {floor_rps:.1f} req/s"
    )
    if rows:
        print(markdown_table(rows, list(rows[0])))
    path = save(
        f"floor_{Path(args.model).name}",
        args.out,
        {
            "args": vars(args),
            "versions": engine_versions(),
            "threads": threads_info(args.threads),
            "flops": flops,
            "gemm": rate,
            "floor_req_per_s": floor_rps,
            "rows": rows,
        },
    )
    print(f"results: {path}")
    return {"flops": flops, "gemm": rate, "floor_req_per_s": floor_rps, "rows": rows}


if __name__ == "__main__":
    main()
