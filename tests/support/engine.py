"""The engine under test: the device this run uses, and the leak check after a run."""

from __future__ import annotations

import os


def engine_device() -> str:
    """The device this run's engines and transformers references use (``--device``)."""
    return os.environ.get("MMSERVE_DEVICE", "cpu")


def attention_backends() -> list[str]:
    """The attention backends an engine on this run's device serves with: the CPU kernel and
    torch's on CPU, torch's and flex on CUDA (the CPU kernel refuses a CUDA device)."""
    return ["cpu-kernel", "torch"] if engine_device() == "cpu" else ["torch", "flex"]


def assert_no_leaks(llm) -> None:
    metrics = llm.get_metrics()
    assert metrics["kv_blocks_used"] == 0, metrics
    assert metrics["encoder_cache_references"] == 0, metrics
    assert metrics["num_requests_running"] == metrics["num_requests_waiting"] == 0
