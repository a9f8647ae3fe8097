"""The result JSON files a ``mmserve bench all`` run writes: the reuse sections' names, and
loading one (None when that section did not run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_result(out: Path, name: str) -> dict[str, Any] | None:
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


def reuse_files(model: str) -> list[tuple[str, str]]:
    """(row label, JSON file name) of the reuse sections, as ``bench reuse`` names them."""
    m = Path(model).name
    return [
        ("0 % reuse", f"reuse_{m}_0pct_grouped_all.json"),
        ("30 % grouped", f"reuse_{m}_30pct_grouped_all.json"),
        ("30 % shuffled", f"reuse_{m}_30pct_shuffled_all.json"),
        ("zipf D=32, all at once", f"reuse_{m}_zipf_D32_all.json"),
        ("zipf D=32, sequential", f"reuse_{m}_zipf_D32_sequential.json"),
    ]
