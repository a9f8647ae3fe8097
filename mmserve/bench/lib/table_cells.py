"""Cells of the README result tables: engine labels, 'median (min-max)' and the fewest
uncontended rounds."""

from __future__ import annotations

from typing import Any

ENGINE_LABELS = {
    "mmserve": "mmserve",
    "mmserve-prefix-off": "prefix-off",
    "mmserve-nocache": "nocache",
    "transformers": "transformers",
    "vllm": "vLLM",
}


def rounds_cell(rows: list[dict[str, Any]]) -> str:
    """'fewest uncontended rounds of any engine / rounds', '–' for results without them."""
    pairs = [
        (r["uncontended_rounds"], r["rounds"])
        for r in rows
        if isinstance(r.get("uncontended_rounds"), int) and isinstance(r.get("rounds"), int)
    ]
    return f"{min(p[0] for p in pairs)} / {pairs[0][1]}" if pairs else "–"


def spread_cell(row: dict[str, Any] | None, key: str, digits: int = 3) -> str:
    """'median (min-max)' with ``digits`` significant digits; '–' when missing."""
    if not row or not isinstance(row.get(key), (int, float)):
        return "–"
    med, lo, hi = row[key], row.get(f"{key}_min"), row.get(f"{key}_max")
    text = f"{med:.{digits}g}"
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and hi > lo:
        text += f" ({lo:.{digits}g}-{hi:.{digits}g})"
    return text
