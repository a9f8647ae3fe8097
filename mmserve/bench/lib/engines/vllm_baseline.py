"""Optional vLLM baseline: run ``vllm_worker.py`` with a python that can import vLLM.

vLLM lives in its own virtualenv (it pins its own torch build); the benchmarks hand it the
workload as JSON (images as PNG files) and read timings back, so both engines run in the same
invocation, one after another, with the same thread count. Settings follow BASELINES.md:
in-process engine, eager, float32, ``VLLM_CPU_KVCACHE_SPACE=2``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mmserve.bench.lib.images import png_bytes
from mmserve.engine_args import EngineArgs
from mmserve.models.tiny import resolve_model_path

WORKER = Path(__file__).with_name("vllm_worker.py")


def vllm_python(explicit: str | None) -> str | None:
    """``--vllm-python`` if given, else this interpreter when it can import vLLM, else None."""
    if explicit:
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


class ImageDir:
    """Writes benchmark images as PNG files once; ``path(seed)`` for the worker."""

    def __init__(self, root: Path, resolution: str | tuple[int, int]) -> None:
        self.root, self.resolution = root, resolution

    def path(self, seed: int) -> str:
        size = self.resolution
        name = size if isinstance(size, str) else f"{size[0]}x{size[1]}"
        file = self.root / f"image-{seed}-{name}.png"
        if not file.exists():
            file.write_bytes(png_bytes(seed, self.resolution))
        return str(file)


def engine_args(
    max_model_len: int, max_images: int, processor_kwargs: dict[str, Any], prefix: bool = True
) -> dict[str, Any]:
    """The vLLM ``LLM(...)`` arguments matching mmserve's defaults (``EngineArgs``)."""
    defaults = EngineArgs()
    args: dict[str, Any] = {
        "max_model_len": max_model_len,
        "max_num_batched_tokens": defaults.max_num_batched_tokens,
        "max_num_seqs": defaults.max_num_seqs,
        "enable_prefix_caching": prefix,
        "limit_mm_per_prompt": {"image": max_images},
    }
    if processor_kwargs:
        args["mm_processor_kwargs"] = dict(processor_kwargs)
    return args


def run_worker(
    python: str,
    model: str,
    payload: dict[str, Any],
    threads: int,
    timeout_s: float = 3600,
    worker: Path = WORKER,
    kv_gib: int = 2,
) -> dict[str, Any]:
    """Run ``worker`` (``vllm_worker.py``, or ``vllm_real.py`` of ``bench real``) on
    ``payload`` (``kind``, ``engine_args``, workload) and return its JSON. ``started`` in the
    payload, if there, is set to the time just before the process starts."""
    with tempfile.TemporaryDirectory(prefix="mmserve-vllm-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        path = str(resolve_model_path(model))
        env = dict(os.environ)
        env.update(
            {
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
                "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads),
                "VLLM_CPU_OMP_THREADS_BIND": "nobind" if threads else "auto",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        env.pop("PYTHONPATH", None)
        if "started" in payload:
            payload = {**payload, "started": time.time()}
        src.write_text(json.dumps({"model": path, **payload}))
        proc = subprocess.run(
            [python, str(worker), str(src), str(dst)],
            env=env,
            timeout=timeout_s,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if proc.returncode != 0 or not dst.exists():
            tail = "\n".join(proc.stdout.splitlines()[-30:])
            raise RuntimeError(f"vLLM worker failed (exit {proc.returncode}):\n{tail}")
        return json.loads(dst.read_text())
