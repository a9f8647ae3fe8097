"""Start and stop the OpenAI-compatible servers ``bench serve --launch`` compares.

- ``mmserve``: ``python -m mmserve.cli serve`` from this checkout (``PYTHONPATH`` points at it),
  EngineArgs defaults plus the workload's ``--model`` / ``--max-pixels``.
- ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` of ``--vllm-python`` with the
  settings of BASELINES.md (float32, eager, KV block size 128, ``VLLM_CPU_KVCACHE_SPACE=2``,
  ``VLLM_CPU_OMP_THREADS_BIND=nobind``: with its default binding it reached a fraction of the
  throughput here) and the scheduler limits of mmserve's defaults (``vllm_baseline.engine_args``).

Both get the same ``OMP_NUM_THREADS``. A server runs in its own process group (so stopping it
stops its helper processes too) but in this session, hence in this process's autogroup: the
priority ``priority.raise_priority`` obtained applies to it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from mmserve.bench.lib.engines.runners import model_max_len
from mmserve.bench.lib.engines.vllm_baseline import WORKER, engine_args
from mmserve.entrypoints.listen_port import free_port
from mmserve.models.tiny import resolve_model_path

ENGINES = ("mmserve", "vllm")
MMSERVE_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Server:
    """A started server: ``base_url`` ends in /v1; ``stop()`` ends its process group."""

    engine: str
    proc: subprocess.Popen
    base_url: str
    log_path: Path
    start_s: float
    command: list[str] = field(default_factory=list)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _thread_env(threads: int) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }


def vllm_checkpoint(python: str, model: str, out_dir: Path) -> str:
    """The model directory vLLM can load (a renamed copy of a flat LLaVA vision tower)."""
    src = str(resolve_model_path(model))
    out = subprocess.run(
        [python, str(WORKER), "--checkpoint", src, str(out_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if out.returncode != 0:
        raise RuntimeError(f"vLLM checkpoint conversion failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def server_command(
    engine: str,
    model: str,
    port: int,
    threads: int,
    processor_kwargs: dict[str, Any],
    vllm_python: str | None = None,
    vllm_model_dir: str | None = None,
    extra_args: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that start ``engine``'s server on 127.0.0.1:``port``."""
    env = _thread_env(threads)
    if engine == "mmserve":
        cmd = [sys.executable, "-m", "mmserve.cli", "serve", "--model", model]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning"]
        if processor_kwargs:
            cmd += ["--processor-kwargs", json.dumps(processor_kwargs)]
        env["PYTHONPATH"] = str(MMSERVE_ROOT)
    elif engine == "vllm":
        if not vllm_python:
            raise SystemExit("the vllm server needs --vllm-python")
        settings = engine_args(model_max_len(model), 1, processor_kwargs)
        cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server"]
        cmd += ["--model", vllm_model_dir or str(resolve_model_path(model))]
        cmd += ["--served-model-name", model, "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--dtype", "float32", "--enforce-eager", "--block-size", "128", "--seed", "0"]
        cmd += ["--max-model-len", str(settings["max_model_len"])]
        cmd += ["--max-num-batched-tokens", str(settings["max_num_batched_tokens"])]
        cmd += ["--max-num-seqs", str(settings["max_num_seqs"])]
        cmd += ["--limit-mm-per-prompt", json.dumps(settings["limit_mm_per_prompt"])]
        if "mm_processor_kwargs" in settings:
            cmd += ["--mm-processor-kwargs", json.dumps(settings["mm_processor_kwargs"])]
        env.pop("PYTHONPATH", None)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            }
        )
    else:
        raise ValueError(f"unknown server engine {engine!r}: {', '.join(ENGINES)}")
    return cmd + list(extra_args or []), env


def start_server(
    engine: str,
    model: str,
    threads: int,
    processor_kwargs: dict[str, Any],
    log: IO[str],
    vllm_python: str | None = None,
    vllm_model_dir: str | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = 300.0,
) -> Server:
    """Start a server and wait until ``/health`` answers 200 (RuntimeError with its log tail
    if it exits or does not get there within ``timeout_s``)."""
    port = free_port()
    cmd, env = server_command(
        engine, model, port, threads, processor_kwargs, vllm_python, vllm_model_dir, extra_args
    )
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=os.setpgrp,  # its own group (stopped as one), same session (autogroup)
    )
    server = Server(engine, proc, f"http://127.0.0.1:{port}/v1", Path(log.name), 0.0, cmd)
    root = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{engine} server exited with {proc.returncode}:\n{server.log_tail()}"
            )
        try:
            if httpx.get(root + "/health", timeout=1.0, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > timeout_s:
            server.stop()
            raise RuntimeError(f"{engine} server not healthy after {timeout_s} s")
        time.sleep(0.25)
    server.start_s = time.perf_counter() - t0
    return server
