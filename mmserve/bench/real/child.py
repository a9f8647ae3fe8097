"""One run of ``mmserve bench real`` in a fresh process: an engine's measurements of one model
(``mmserve`` or ``transformers``; vLLM's run in its own virtualenv,
``lib/engines/vllm_real.py``), the machine's limits, or a model's prefill FLOPs.

    python -m mmserve.bench.real.child IN.json OUT.json

IN holds ``kind`` (``mmserve``, ``transformers``, ``limits`` or ``flops``), ``profile`` (the
``Profile`` as JSON), ``model`` and ``started`` (``time.time()`` just before this process was
started: an engine's ``load_s`` counts from it, imports included, as vLLM's does). OUT gets the
result and ``peak_rss`` (bytes).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from mmserve.bench.gpu.plan import Profile


def read_bandwidth(nbytes: int, repeats: int = 10) -> float:
    """Bytes read per second summing a float32 buffer of ``nbytes`` (best of ``repeats``): the
    rate decode's weight reads can reach."""
    import torch

    from mmserve.bench.gpu.limits import best_seconds

    data = torch.ones(nbytes // 4)
    return nbytes / best_seconds(data.sum, torch.device("cpu"), repeats)


def linear_rate(size: int, dtype: Any, repeats: int = 10) -> float:
    """FLOP/s of ``F.linear`` (the models' matmul) on ``size``-square operands in ``dtype``."""
    import torch
    import torch.nn.functional as F

    from mmserve.bench.gpu.limits import best_seconds

    x = torch.randn(size, size).to(dtype)
    weight = torch.randn(size, size).to(dtype)
    seconds = best_seconds(lambda: F.linear(x, weight), torch.device("cpu"), repeats)
    return 2 * size**3 / seconds


def limits(profile: Profile) -> dict[str, Any]:
    """Read bandwidth (GB/s) and the matmul rate (GFLOP/s) in the benchmark's dtype."""
    import torch

    rate = linear_rate(profile.matmul_size, getattr(torch, profile.bench_dtype))
    return {
        "read_bytes": profile.copy_bytes,
        "read_gb_s": read_bandwidth(profile.copy_bytes) / 1e9,
        "matmul_size": profile.matmul_size,
        "matmul_dtype": profile.bench_dtype,
        "matmul_gflop_s": rate / 1e9,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def prefill_flops(profile: Profile, model: str) -> dict[str, Any]:
    """Matrix FLOPs of the first TTFT request (its image encoded, its prompt prefilled),
    counted on the transformers reference (``bench floor``'s counter)."""
    from mmserve.bench.floor import count_request_flops
    from mmserve.bench.gpu.measure import TTFT_RUN
    from mmserve.bench.lib.engines.runners import processor_kwargs_for
    from mmserve.bench.lib.workloads import Spec

    pkw = processor_kwargs_for(model, None)
    return count_request_flops(model, profile.resolution, 1, pkw, Spec(0, 0, 0, TTFT_RUN))


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    profile = Profile.from_json(cfg["profile"])
    kind, model, started = cfg["kind"], cfg.get("model"), cfg["started"]
    if kind == "limits":
        return limits(profile)
    assert model is not None, "engine runs name a model"
    if kind == "flops":
        return prefill_flops(profile, model)
    from mmserve.bench.gpu.engines import workload
    from mmserve.bench.gpu.measure import measure_mmserve, measure_transformers

    work = workload(profile, model)
    if kind == "mmserve":
        return measure_mmserve(profile, model, work, started)
    if kind == "transformers":
        return measure_transformers(profile, model, work, started, cfg.get("reuse", False))
    raise ValueError(f"unknown run kind {kind!r}")


def main(argv: list[str]) -> None:
    cfg = json.loads(Path(argv[0]).read_text())
    out = run(cfg)
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["seconds"] = time.time() - cfg["started"]
    Path(argv[1]).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
