"""The reuse workload's runs on each engine: mmserve in its cache modes, transformers and
vLLM, each run on a fresh, warmed-up engine, with its timings and cache counters."""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.engines.meter import Meter
from mmserve.bench.lib.engines.reference import HFReference
from mmserve.bench.lib.engines.runners import model_max_len, run_transformers
from mmserve.bench.lib.engines.vllm_baseline import ImageDir, engine_args, run_worker
from mmserve.bench.lib.images import synthetic_image
from mmserve.bench.lib.workloads import RUN_STRIDE, WARMUP_RUN, Spec, warmup_specs
from mmserve.bench.reuse.workload import Workload
from mmserve.engine_args import EngineArgs
from mmserve.inputs import PromptInput

MODES: dict[str, dict[str, Any]] = {
    "mmserve": {},
    "mmserve-prefix-off": {"enable_prefix_caching": False},
    "mmserve-nocache": {"enable_prefix_caching": False, "enable_encoder_cache": False},
}
ENGINES = [*MODES, "transformers", "vllm"]
WARMUP_REQUESTS = 8  # x ~320 prompt tokens: more than one step's 2048-token budget


def run_mmserve(llm: LLM, requests: list[dict], max_tokens: int, arrival: str) -> dict[str, Any]:
    """TTFT from submission: the batch's start (``all``) or the request's own (``sequential``)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    before = llm.get_metrics()
    meter = Meter()
    t0 = time.monotonic()
    if arrival == "all":
        outs = llm.generate(requests, params, use_tqdm=True)
        ttfts = [o.metrics["first_token_time"] - t0 for o in outs]
    else:
        outs, ttfts = [], []
        for request in tqdm(requests, desc="sequential"):
            start = time.monotonic()
            outs += llm.generate(request, params, use_tqdm=False)
            ttfts.append(outs[-1].metrics["first_token_time"] - start)
    wall = time.monotonic() - t0
    metered = meter.stop()
    m = llm.get_metrics()
    delta = {k: m[k] - before[k] for k in m}
    lookups = delta["encoder_cache_hits"] + delta["encoder_cache_misses"]
    return {
        "wall_s": wall,
        "meter": metered,
        "ttfts": ttfts,
        "outputs": [o.outputs[0].token_ids for o in outs],
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
        "cached_tokens": sum(o.num_cached_tokens for o in outs),
        "prefix_hit_rate": delta["prefix_cache_hits"] / max(delta["prefix_cache_queries"], 1),
        "encoder_hit_rate": delta["encoder_cache_hits"] / max(lookups, 1),
        "images_encoded": delta["encoder_images_encoded"],
        "embeddings_computed": delta["encoder_embeddings_computed"],
        "encoder_s": delta["encoder_seconds"],
    }


def preprocess_seconds(llm: LLM, work: Workload, samples: int = 3) -> float:
    """Admission cost of a new image (decode-free: PIL in; hash + HF preprocessing) minus that
    of an image the admission memo has seen: per-distinct-image work besides the encoder."""
    prompt = work.prompt(warmup_specs(1)[0])
    fresh: list[float] = []
    seen: list[float] = []
    for i in range(samples):
        image = synthetic_image(WARMUP_RUN * RUN_STRIDE + 1000 + i, work.resolution)
        for times in (fresh, seen):
            start = time.perf_counter()
            llm.engine.intake.process(PromptInput(prompt, [image]))
            times.append(time.perf_counter() - start)
    return max(statistics.median(fresh) - statistics.median(seen), 0.0)


def engine_runs(
    engine: str,
    args: argparse.Namespace,
    work: Workload,
    runs: list[list[Spec]],
    pkw: dict[str, Any],
    python: str | None,
) -> list[dict[str, Any]]:
    """Each run on a fresh engine, warmed up on other images: batching engines on
    ``WARMUP_REQUESTS`` at once (more than one step's token budget, so their working memory is
    grown before the clock starts, as vLLM's start-up profiling run does for it),
    transformers on two; then ``gc.collect()`` so no earlier engine's garbage is collected
    inside the timed window."""
    warm = work.requests(warmup_specs(WARMUP_REQUESTS))
    if engine == "vllm":
        if python is None:
            raise SystemExit("vllm is not importable here: pass --vllm-python")
        with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as tmp:
            files = ImageDir(Path(tmp), args.resolution)

            def as_files(specs: list[Spec]) -> list[dict]:
                return [
                    {"prompt": work.prompt(s), "image": files.path(s.image_seed)} for s in specs
                ]

            results = []
            for specs in tqdm(runs, desc="vllm runs"):
                payload = {
                    "kind": "requests",
                    "max_tokens": args.max_tokens,
                    "arrival": args.arrival,
                    "warmup": as_files(warmup_specs(WARMUP_REQUESTS)),
                    "engine_args": engine_args(model_max_len(args.model), 1, pkw),
                    "runs": [as_files(specs)],
                }
                results += run_worker(python, args.model, payload, args.threads)["runs"]
            return results
    if engine == "transformers":
        ref = HFReference(args.model, pkw)
        for request in warm[:2]:
            ref.generate(ref.inputs(request["prompt"], request["images"]), 2, time.monotonic)
        results = []
        for specs in tqdm(runs, desc="transformers runs"):
            ref.encoder_seconds = 0.0
            gc.collect()
            results.append(
                run_transformers(ref, work.requests(specs), args.max_tokens, args.arrival)
            )
        return results
    if engine not in MODES:
        raise SystemExit(f"unknown engine {engine!r}: {', '.join(ENGINES)}")
    results = []
    for specs in tqdm(runs, desc=f"{engine} runs"):
        base = EngineArgs.from_cli_args(args)
        llm = LLM(**base.as_kwargs(processor_kwargs=pkw, **MODES[engine]))
        llm.generate(warm, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
        prep = preprocess_seconds(llm, work)
        gc.collect()
        results.append(run_mmserve(llm, work.requests(specs), args.max_tokens, args.arrival))
        results[-1]["preprocess_per_image_s"] = prep
        del llm
    return results
