"""One workload under several process environments (allocator, OpenMP binding, threads), in
interleaved rounds: ``mmserve bench envs --variants glibc,tcmalloc,jemalloc -- reuse --reuse 0``.

What the variants change (``LD_PRELOAD``, ``OMP_*``, ``GOMP_CPU_AFFINITY``, ...) only takes effect
at process start, so every (round, variant) is a fresh ``mmserve bench <workload> --rounds 1``
process; round r runs every variant once, in an order rotated per round. The table shows, per
variant and engine, the median and min-max of requests/s over rounds and the ratio to the first
variant. Presets (``--list``) cover the allocators (the preload is skipped, with the reason, when
the library is not installed: ``apt-get install libtcmalloc-minimal4 libjemalloc2``), glibc
with / without mmserve's malloc tuning (``engine/setup/malloc_tuning.py``), OpenMP binding and
wait policy; ``--variant 'name:KEY=VALUE ... [--workload-flag value]'`` adds your own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mmserve.bench.lib.harness import fmt_spread, interleaved, with_spread
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions, threads_info
from mmserve.bench.lib.report import markdown_table, save

ROOT = Path(__file__).resolve().parents[2]
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
TCMALLOC = "libtcmalloc_minimal.so.4"
JEMALLOC = "libjemalloc.so.2"


def find_library(name: str) -> str | None:
    for directory in LIB_DIRS:
        path = Path(directory) / name
        if path.exists():
            return str(path)
    return None


def presets(threads: int) -> dict[str, dict[str, str]]:
    """name -> environment; a value None-free dict. Thread-dependent ones use ``threads``."""
    cpus = f"0-{threads - 1}" if threads > 1 else "0"
    return {
        "glibc": {"MMSERVE_MALLOC_TUNING": "0"},
        "glibc-tuned": {"MMSERVE_MALLOC_TUNING": "1"},
        "tcmalloc": {"LD_PRELOAD": TCMALLOC, "MMSERVE_MALLOC_TUNING": "0"},
        "jemalloc": {"LD_PRELOAD": JEMALLOC, "MMSERVE_MALLOC_TUNING": "0"},
        "jemalloc-nodecay": {
            "LD_PRELOAD": JEMALLOC,
            "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1",
            "MMSERVE_MALLOC_TUNING": "0",
        },
        "omp-bind-close": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
        "omp-bind-spread": {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"},
        "gomp-affinity": {"GOMP_CPU_AFFINITY": cpus},
        "omp-passive": {"OMP_WAIT_POLICY": "PASSIVE"},
        "omp-active": {"OMP_WAIT_POLICY": "ACTIVE"},
    }


def parse_variant(text: str) -> tuple[str, dict[str, str], list[str]]:
    """'name:KEY=VALUE ... --flag value' -> (name, env, extra workload args)."""
    name, _, rest = text.partition(":")
    env, extra = {}, []
    tokens = shlex.split(rest)
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            extra = tokens[i:]
            break
        key, eq, value = token.partition("=")
        if not eq:
            raise SystemExit(f"variant {name!r}: expected KEY=VALUE, got {token!r}")
        env[key] = value
    return name, env, extra


def resolve(env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """Library names in LD_PRELOAD -> paths; (env, None) or (env, why it cannot run)."""
    preload = env.get("LD_PRELOAD")
    if not preload or "/" in preload:
        return env, None
    path = find_library(preload)
    if path is None:
        return env, f"{preload} not found in {', '.join(LIB_DIRS)}"
    return {**env, "LD_PRELOAD": path}, None


def run_variant(
    workload: str,
    workload_args: list[str],
    env: dict[str, str],
    extra: list[str],
    out: Path,
    threads: int,
    rnd: int = 0,
) -> dict[str, Any]:
    """One fresh ``mmserve bench <workload>`` process running round ``rnd`` (its engines in
    that round's rotated order); returns its saved JSON (+ exit code)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mmserve.bench.cli", workload, *workload_args, *extra]
    cmd += ["--rounds", "1", "--rotation-offset", str(rnd), "--out", str(out)]
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    child_env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    child_env.update(env)
    proc = subprocess.run(
        cmd, env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=7200
    )
    (out / "log.txt").write_text(proc.stdout + proc.stderr)
    files = sorted(out.glob("*.json"))
    if proc.returncode != 0 or not files:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        return {"exit": proc.returncode, "error": tail}
    data = json.loads(files[0].read_text())
    data["exit"] = proc.returncode
    return data


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmserve bench envs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--variants", default="glibc,glibc-tuned,tcmalloc,jemalloc")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra variant 'name:KEY=VALUE ... [--workload-flag value]' (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    parser.add_argument(
        "workload", nargs=argparse.REMAINDER, help="-- <workload> [its flags] (default: reuse)"
    )
    add_priority_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    table = presets(args.threads)
    if args.list:
        for name, env in table.items():
            print(f"{name}: {' '.join(f'{k}={v}' for k, v in env.items())}")
        return {}
    rest = [a for a in args.workload if a != "--"] or ["reuse"]
    workload, workload_args = rest[0], rest[1:] + ["--threads", str(args.threads)]
    variants: dict[str, tuple[dict[str, str], list[str]]] = {}
    skipped: dict[str, str] = {}
    for name in filter(None, args.variants.split(",")):
        if name not in table:
            raise SystemExit(f"unknown variant {name!r}: {', '.join(table)} (or --variant)")
        variants[name] = (table[name], [])
    for text in args.variant:
        name, env, extra = parse_variant(text)
        variants[name] = (env, extra)
    resolved: dict[str, tuple[dict[str, str], list[str]]] = {}
    for name, (env, extra) in variants.items():
        env, why = resolve(env)
        if why:
            skipped[name] = why
            print(f"skipping {name}: {why}")
        else:
            resolved[name] = (env, extra)
    priority = apply_priority(args)
    with tempfile.TemporaryDirectory(prefix="mmserve-envs-") as tmp:

        def run(name: str, rnd: int) -> dict[str, Any]:
            env, extra = resolved[name]
            print(f"round {rnd + 1}/{args.rounds}: {name}", flush=True)
            out = Path(tmp) / f"{name}_{rnd}"
            return run_variant(workload, workload_args, env, extra, out, args.threads, rnd)

        results, order = interleaved(list(resolved), args.rounds, run)
    rows = []
    base: dict[str, float] = {}
    for name, runs in results.items():
        ok = [r for r in runs if r.get("exit") == 0 and r.get("rows")]
        engines = list(dict.fromkeys(row["engine"] for r in ok for row in r["rows"]))
        for engine in engines:
            values = [
                row["req_per_s"]
                for r in ok
                for row in r["rows"]
                if row["engine"] == engine and "req_per_s" in row
            ]
            if not values:
                continue
            out: dict[str, Any] = {"variant": name, "engine": engine}
            with_spread(out, "req_per_s", values)
            out["req_per_s_spread"] = fmt_spread(out, "req_per_s")
            base.setdefault(engine, out["req_per_s"])
            out["ratio"] = out["req_per_s"] / base[engine]
            others = [
                row.get("others_cores_max")
                for r in ok
                for row in r["rows"]
                if row["engine"] == engine and row.get("others_cores_max") is not None
            ]
            out["others_cores_max"] = max(others) if others else None
            out["env"] = " ".join(f"{k}={v}" for k, v in resolved[name][0].items())
            out["failed_runs"] = len(runs) - len(ok)
            rows.append(out)
        if len(ok) < len(runs):
            first = next(r for r in runs if r.get("exit") != 0 or not r.get("rows"))
            print(f"{name}: {len(runs) - len(ok)} run(s) failed: {first.get('error', '')}")
    columns = ["variant", "engine", "req_per_s", "req_per_s_spread", "ratio", "others_cores_max"]
    print(
        f"\nenvs: {workload} {' '.join(workload_args)}; {args.rounds} interleaved rounds, "
        f"fresh process per run, {priority['effective']}"
    )
    print(markdown_table(rows, [*columns, "env"]))
    path = save(
        f"envs_{workload}",
        args.out,
        {
            "args": vars(args),
            "versions": engine_versions(),
            "threads": threads_info(args.threads),
            "variants": {k: {"env": v[0], "extra_args": v[1]} for k, v in resolved.items()},
            "skipped": skipped,
            "round_order": order,
            "rows": rows,
            "runs": {k: [r.get("rows", r.get("error")) for r in v] for k, v in results.items()},
        },
    )
    print(f"results: {path}")
    return {"rows": rows, "path": str(path), "skipped": skipped}


if __name__ == "__main__":
    main()
