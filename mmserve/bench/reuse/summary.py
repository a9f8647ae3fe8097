"""``bench reuse``'s summaries: one engine's row over its rounds, and the encode-once limit of
the Zipf workload."""

from __future__ import annotations

import statistics
from typing import Any

from mmserve.bench.lib.harness import (
    MAX_OTHERS,
    contention_summary,
    fmt_spread,
    is_contended,
    uncontended,
    with_spread,
)
from mmserve.bench.lib.workloads import latency_summary


def row(
    engine: str,
    runs: list[dict[str, Any]],
    num_requests: int,
    max_others: float = MAX_OTHERS,
) -> dict[str, Any]:
    """Median (and min / max / quartiles) over the uncontended rounds (all rounds if every one
    was contended) of wall time and throughput; medians of the other scalars; TTFT percentiles
    of the median-wall round."""
    results = uncontended(runs, [r.get("meter") for r in runs], max_others)
    mid = sorted(results, key=lambda r: r["wall_s"])[len(results) // 2]
    walls = [r["wall_s"] for r in results]
    out: dict[str, Any] = {"engine": engine}
    with_spread(out, "wall_s", walls)
    with_spread(out, "req_per_s", [num_requests / w for w in walls])
    out["out_tok_per_s"] = sum(len(t) for t in mid["outputs"]) / out["wall_s"]
    out.update(latency_summary(mid["ttfts"], "ttft"))
    out["cached_token_frac"] = mid["cached_tokens"] / max(mid["prompt_tokens"], 1)
    for key in (
        "prefix_hit_rate",
        "encoder_hit_rate",
        "images_encoded",
        "embeddings_computed",
        "encoder_s",
    ):
        if key in mid:
            out[key] = statistics.median(r[key] for r in results)
    out["walls"] = [r["wall_s"] for r in runs]
    out["rounds"] = len(runs)
    contended = sum(is_contended(r.get("meter"), max_others) for r in runs)
    out["uncontended_rounds"] = len(runs) - contended
    out.update(contention_summary([r.get("meter") for r in results]))
    out["req_per_s_spread"] = fmt_spread(out, "req_per_s")
    return out


def encode_once(results: dict[str, list[dict]], distinct: int) -> dict[str, Any]:
    """The encode-once limit of each repeat, from mmserve with its encoder cache on: its D = 1
    floor + (D - 1) x its encoder seconds per image. Every engine's wall time is divided by the
    limit of the same repeat (runs are interleaved, so pairing cancels slow drift); medians."""
    ref = next((e for e in ("mmserve", "mmserve-prefix-off") if e in results), None)
    if ref is None:
        return {}
    limits = []
    for run, floor in zip(results[ref][0::2], results[ref][1::2], strict=True):
        per_image = run["encoder_s"] / max(run["images_encoded"], 1)
        prep = run["preprocess_per_image_s"]
        limits.append(
            (
                floor["wall_s"],
                per_image,
                prep,
                floor["wall_s"] + (distinct - 1) * per_image,
                floor["wall_s"] + (distinct - 1) * (per_image + prep),
            )
        )

    def ratios(k: int) -> dict[str, float]:
        return {
            engine: statistics.median(
                r["wall_s"] / lim[k] for r, lim in zip(res[0::2], limits, strict=True)
            )
            for engine, res in results.items()
        }

    floor_s, per_image_s, prep_s, limit_s, limit_prep_s = (
        statistics.median(x) for x in zip(*limits, strict=True)
    )
    return {
        "reference": ref,
        "floor_s": floor_s,
        "per_image_s": per_image_s,
        "preprocess_per_image_s": prep_s,
        "limit_s": limit_s,
        "wall_over_limit": ratios(3),
        "limit_incl_preprocess_s": limit_prep_s,
        "wall_over_limit_incl_prep": ratios(4),
    }
