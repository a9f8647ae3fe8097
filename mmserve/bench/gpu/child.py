"""The engine process of a GPU run: runs the stages it is given in order and appends one JSON
line per event to the progress file, which the supervisor (``supervise.py``) watches to hold
each stage to its time box.

    python -m mmserve.bench.gpu.child PLAN.json PROGRESS.jsonl

Events: ``{"event": "start", "stage": name, "time": t}`` and ``{"event": "done", "stage":
name, "status": "ok" | "failed", "seconds": s, "result" | "error": ...}``. After a failed stage
the process exits (code 3) so the stages after it start in a fresh process (a CUDA error can
leave the context unusable).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from mmserve.bench.gpu.plan import Profile, Stage


def _emit(progress: Path, event: dict[str, Any]) -> None:
    with open(progress, "a") as f:
        f.write(json.dumps(event, default=str) + "\n")


def env_stage(profile: Profile) -> dict[str, Any]:
    import platform

    import torch

    from mmserve.bench.lib.provenance import engine_versions

    versions = engine_versions()
    # a device machine gets the files without .git: the caller names the commit
    versions["mmserve_commit"] = versions["mmserve_commit"] or os.environ.get("MMSERVE_COMMIT")
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "versions": versions,
        "cuda_available": torch.cuda.is_available(),
        "device": profile.device,
        "threads": torch.get_num_threads(),
    }
    if profile.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device")
        props = torch.cuda.get_device_properties(torch.device(profile.device))
        out.update(
            device_name=props.name,
            memory_gib=props.total_memory / (1 << 30),
            multiprocessors=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            torch_cuda=torch.version.cuda,
        )
    else:
        out["device_name"] = f"CPU ({torch.backends.cpu.get_cpu_capability()})"
    return out


def build_stage(profile: Profile) -> dict[str, Any]:
    from mmserve.models.tiny import resolve_model_path

    built: dict[str, Any] = {}
    for model in dict.fromkeys(profile.models + profile.parity_models):
        start = time.perf_counter()
        path = resolve_model_path(model)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        built[model] = {"seconds": time.perf_counter() - start, "weight_bytes": size}
    return built


def run_stage(profile: Profile, stage: Stage) -> dict[str, Any]:
    if stage.kind == "env":
        return env_stage(profile)
    if stage.kind == "build":
        return build_stage(profile)
    if stage.kind == "limits":
        from mmserve.bench.gpu.limits import measure_limits

        return measure_limits(profile.device, profile.copy_bytes, profile.matmul_size)
    assert stage.model is not None, stage
    if stage.kind == "parity":
        from mmserve.bench.gpu.parity import parity

        return parity(profile, stage.model)
    if stage.kind == "bench":
        from mmserve.bench.gpu.measure import bench_model

        return bench_model(profile, stage.model)
    if stage.kind == "profile":
        from mmserve.bench.gpu.profiling import profile_model

        return profile_model(profile, stage.model)
    raise ValueError(f"not a stage of the engine process: {stage.name}")


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    progress = Path(argv[1])
    profile = Profile.from_json(plan["profile"])
    for raw in plan["stages"]:
        stage = Stage(**raw)
        _emit(progress, {"event": "start", "stage": stage.name, "time": time.time()})
        start = time.perf_counter()
        try:
            result = run_stage(profile, stage)
        except Exception as exc:  # fail soft: recorded, the next stages run in a new process
            error = f"{type(exc).__name__}: {exc}"
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            _emit(
                progress,
                {
                    "event": "done",
                    "stage": stage.name,
                    "status": "failed",
                    "seconds": time.perf_counter() - start,
                    "error": error[-2000:],
                },
            )
            return 3
        _emit(
            progress,
            {
                "event": "done",
                "stage": stage.name,
                "status": "ok",
                "seconds": time.perf_counter() - start,
                "result": result,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
