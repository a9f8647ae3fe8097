"""The multiturn tables: per-turn medians over the uncontended rounds, and per engine the
turn-N / turn-1 TTFT, encode totals and output identity."""

from __future__ import annotations

from typing import Any

from mmserve.bench.lib.harness import (
    MAX_OTHERS,
    contention_summary,
    fmt_spread,
    is_contended,
    uncontended,
    with_spread,
)


def median_rows(
    engine: str, conversations: list[list[dict]], max_others: float = MAX_OTHERS
) -> list[dict[str, Any]]:
    """Per turn: the first round's counts and tokens (every engine's round r shows the same
    images), the median (and min / max) of the timings over the uncontended rounds (all rounds
    if every one was contended)."""
    meters = [conv[-1].get("meter") for conv in conversations]
    repeats = uncontended(conversations, meters, max_others)
    rows = []
    for first, turn_rows in zip(conversations[0], zip(*repeats, strict=True), strict=True):
        row = {"engine": engine, **first}
        row.pop("meter", None)
        for key in ("ttft_s", "encoder_s"):
            if key in row:
                with_spread(row, key, [r[key] for r in turn_rows])
        row["ttft_spread"] = fmt_spread(row, "ttft_s")
        rows.append(row)
    rows[-1].update(contention_summary([conv[-1].get("meter") for conv in repeats]))
    rows[-1]["uncontended_rounds"] = sum(not is_contended(m, max_others) for m in meters)
    rows[-1]["rounds"] = len(conversations)
    return rows


def summarize(rows: list[dict], engines: list[str], turns: int) -> list[dict[str, Any]]:
    """turn-N / turn-1 TTFT, encode totals and output identity per engine."""
    by_engine = {e: [r for r in rows if r["engine"] == e] for e in engines}
    first = by_engine[engines[0]]
    out = []
    for engine, erows in by_engine.items():
        total_images = sum(r.get("images_encoded", 0) for r in erows)
        computed = sum(r.get("embeddings_computed", 0) for r in erows)
        distinct = erows[-1].get("image_tokens", 0)
        out.append(
            {
                "engine": engine,
                "ttft_turn1_s": erows[0]["ttft_s"],
                f"ttft_turn{turns}_s": erows[-1]["ttft_s"],
                f"ttft_turn{turns}_spread": erows[-1]["ttft_spread"],
                "turnN_over_turn1": erows[-1]["ttft_s"] / erows[0]["ttft_s"],
                "ttft_total_s": sum(r["ttft_s"] for r in erows),
                "total_vs_first": sum(r["ttft_s"] for r in erows) / sum(r["ttft_s"] for r in first),
                "images_encoded": total_images if "images_encoded" in erows[0] else "n/a",
                "embeddings_computed/distinct": computed / distinct if distinct else "n/a",
                "same_tokens_as_first": all(
                    a["token_ids"] == b["token_ids"] for a, b in zip(erows, first, strict=True)
                ),
                "others_cores_max": erows[-1].get("others_cores_max"),
                "uncontended_rounds": erows[-1].get("uncontended_rounds"),
            }
        )
    return out
