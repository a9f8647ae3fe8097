"""Fair comparison of engines over repeated runs: interleaved rounds, contended runs told
apart (and run again), median and spread.

- **Interleaved rounds.** ``interleaved(engines, rounds, run)``: round 1 runs every engine
  once, round 2 every engine again, ...; the order rotates per round so no engine always
  follows the same one. Slow drift and a neighbour's burst hit every engine alike instead of
  all the repeats of one.
- **Contention.** A run during which other processes took more than ``--max-others`` cores
  (``engines/meter.py``) is contended: run again up to ``--retries`` times, left out of the medians
  when uncontended runs exist.
- **Median and spread.** ``spread(values)``: median, min, max, quartiles, n.

The scheduling priority is in ``priority.py``, engine versions in ``provenance.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def add_rotation_arg(parser: Any) -> None:
    parser.add_argument(
        "--rotation-offset",
        type=int,
        default=0,
        help="start the engine-order rotation at this round (for one round per process)",
    )


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
