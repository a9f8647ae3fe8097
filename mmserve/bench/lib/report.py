"""Markdown tables, JSON results and PNG plots for benchmark runs."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from mmserve.bench.lib.priority import priority_state


def environment() -> dict[str, Any]:
    """Where and how a result was measured (numbers on a shared 2-core box are noisy: the load
    average and each run's ``others_cores`` say how noisy), with the scheduling priority
    obtained (``priority.raise_priority``)."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "commit": git_commit(),
        "priority": priority_state(),
    }


def git_commit() -> str | None:
    """HEAD of the mmserve checkout (+ "-dirty" with local changes), None outside git."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=5,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty.strip() else "")


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A GitHub markdown table; floats with 4 significant digits, missing cells empty."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def save(name: str, out_dir: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``{out_dir}/{name}.json`` with the environment and ``payload``; returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"env": environment(), **payload}, indent=2, default=str))
    return path


def plot_lines(
    path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]]
) -> Path | None:
    """One line per series; skipped (None) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
