"""The GPU run in one command: environment, preset builds, measured limits, parity with
transformers, benchmarks of real shapes against transformers and the limits, and a pytest
selection on the device; every stage time-boxed, a failed one recorded and the rest run.
Writes ``gpu.json`` and ``gpu.md`` (plus ``gpu.log``, ``pytest.log``, ``pytest.xml``) under
``--out`` and prints a short summary. ``benchmarks/gpu/run.sh`` installs mmserve on the device
machine and runs this; see docs/gpu.md.

    mmserve bench gpu                  # CUDA, the Qwen2-VL-2B and Qwen2.5-VL-3B shapes
    mmserve bench gpu --dry-run        # CPU, tiny presets: the same stages in ~1 minute
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mmserve.bench.gpu.plan import DRY_RUN, GPU, select, stages
from mmserve.bench.gpu.supervise import run_child_stages, run_pytest
from mmserve.bench.gpu.tables import render, summary

ROOT = Path(__file__).resolve().parents[3]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny presets, small counts")
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or "bench_results/gpu",
        help="result folder (default: $OUT, else %(default)s)",
    )
    parser.add_argument("--only", default=None, help="comma list of stage kinds or names")
    parser.add_argument("--models", default=None, help="comma list replacing the benchmarked")
    parser.add_argument("--device", default=None, help="replaces the profile's device")
    parser.add_argument("--budget-s", type=float, default=None, help="the whole run's seconds")
    return parser


def _positive(value: float | None, flag: str) -> float | None:
    if value is not None and value <= 0:
        raise SystemExit(f"mmserve bench gpu: {flag} must be positive, got {value}")
    return value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    profile = DRY_RUN if args.dry_run else GPU
    changes: dict[str, Any] = {}
    if args.models:
        changes["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
        changes["parity_models"] = changes["profile_models"] = changes["models"][:1]
    if args.device:
        changes["device"] = args.device
    if _positive(args.budget_s, "--budget-s"):
        changes["budget_s"] = args.budget_s
    profile = dataclasses.replace(profile, **changes)
    try:
        plan = select(stages(profile), args.only)
    except ValueError as exc:
        raise SystemExit(f"mmserve bench gpu: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + profile.budget_s
    results: dict[str, Any] = {
        "mode": profile.mode,
        "device": profile.device,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "profile": profile.as_json(),
        "stages": [],
        "seconds": 0.0,
    }
    order = {s.name: i for i, s in enumerate(plan)}

    def on_record(rec: dict[str, Any]) -> None:
        results["stages"].append(rec)
        results["stages"].sort(key=lambda r: order[r["name"]])
        results["seconds"] = time.monotonic() - started
        print(
            f"[{results['seconds']:5.0f} s] {rec['name']}: {rec['status']} "
            f"({rec['seconds']:.1f} s)",
            flush=True,
        )
        (out / "gpu.json").write_text(json.dumps(results, indent=2, default=str))

    child = [s for s in plan if s.kind != "pytest"]
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)  # children import ROOT
    os.environ.setdefault("TQDM_DISABLE", "1")
    print(
        f"mmserve bench gpu ({profile.mode}, {profile.device}): "
        f"{', '.join(s.name for s in plan)}; budget {profile.budget_s:.0f} s",
        flush=True,
    )
    with open(out / "gpu.log", "w") as log:
        if child:
            run_child_stages(profile, child, deadline, log, on_record)
    for stage in plan:
        if stage.kind == "pytest":
            on_record(run_pytest(profile, stage, deadline, out, ROOT))
    results["seconds"] = time.monotonic() - started
    (out / "gpu.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "gpu.md").write_text(render(results))
    print(summary(results))
    print(f"results: {out / 'gpu.json'}, {out / 'gpu.md'}")
    failed = [s["name"] for s in results["stages"] if s["status"] != "ok"]
    return {"failed": failed, "path": str(out / "gpu.json")}


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
