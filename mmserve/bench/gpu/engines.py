"""The engines a GPU-run stage compares, built alike from the profile: mmserve (``LLM``) and
the transformers reference on the same device and dtype, one at a time (``release`` frees
one before the next loads), and the prompts they share."""

from __future__ import annotations

import gc
import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from mmserve import LLM
from mmserve.bench.gpu.plan import Profile
from mmserve.bench.lib.engines.reference import HFReference
from mmserve.bench.lib.engines.runners import processor_kwargs_for
from mmserve.bench.lib.workloads import Spec
from mmserve.bench.reuse.workload import Workload
from mmserve.entrypoints.chat_utils import render_chat
from mmserve.models.tiny import resolve_model_path

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
STORY = "Write a long story about a lighthouse keeper and the ships she watches."


# Decode graphs the run captures: batch buckets up to the largest measured batch (32) and
# contexts up to 4096 tokens, 6 x 5 = 30 graphs per engine instead of the defaults' 66, so
# capture stays a few seconds of the GPU window.
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
GRAPH_MAX_CONTEXT = 4096


def mmserve_engine(profile: Profile, model: str, dtype: str) -> LLM:
    """mmserve with its caches on, sized for the profile (a fraction of the GPU's memory on
    CUDA, so a transformers model fits beside what is not yet freed), and its decode graphs
    on unless the profile says ``enforce_eager`` (captured on CUDA, the padded static path
    on CPU)."""
    memory: dict[str, Any] = (
        {"gpu_memory_utilization": profile.gpu_memory_utilization}
        if profile.device.startswith("cuda")
        else {"kv_cache_memory": profile.kv_cache_memory}
    )
    return LLM(
        model,
        device=profile.device,
        dtype=dtype,
        seed=0,
        max_model_len=profile.max_model_len,
        processor_kwargs=processor_kwargs_for(model, None),
        limit_mm_per_prompt={"image": max(profile.turns, 2)},
        enforce_eager=profile.enforce_eager,
        cuda_graph_sizes=list(GRAPH_BATCH_SIZES),  # the measured batches and the steps between
        max_seq_len_to_capture=GRAPH_MAX_CONTEXT,
        **memory,
    )


def graph_record(llm: LLM) -> dict[str, Any]:
    """What the engine's decode graphs are: ``mode`` captured (CUDA), static (the padded path
    without capture) or off (none, or their capture failed: the log says why), how many,
    the capture's seconds, and the decode steps they ran so far."""
    graphs = llm.engine.decode_graphs
    if graphs is None:
        return {"mode": "off", "graphs": 0, "capture_s": 0.0, "steps": 0}
    return {
        "mode": "captured" if graphs.config.capture else "static",
        "graphs": graphs.num_graphs,
        "capture_s": graphs.capture_seconds,
        "steps": graphs.steps,
    }


@contextmanager
def eager_decode(llm: LLM) -> Iterator[bool]:
    """Decode without the graphs inside the block (True when there were graphs to turn
    off)."""
    graphs = llm.engine.decode_graphs
    if graphs is None:
        yield False
        return
    enabled, graphs.enabled = graphs.enabled, False
    try:
        yield True
    finally:
        graphs.enabled = enabled


def reference(profile: Profile, model: str, dtype: str) -> HFReference:
    """transformers' model of the checkpoint on the profile's device, in ``dtype``."""
    return HFReference(
        model, processor_kwargs_for(model, None), profile.device, TORCH_DTYPES[dtype]
    )


def release(device: str) -> None:
    """Free what the engine just dropped (call after ``del``)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def workload(profile: Profile, model: str) -> Workload:
    return Workload(model, profile.resolution)


def image_requests(work: Workload, count: int, run: int) -> list[dict[str, Any]]:
    """``count`` chat requests, each about a new image (run ``run``'s seeds)."""
    return work.requests([Spec(i, i, i, run) for i in range(count)])


def text_prompt(work: Workload) -> str:
    """A text-only chat prompt (the decode measurements' prompt)."""
    conv = [{"role": "user", "content": [{"type": "text", "text": STORY}]}]
    return render_chat(work.tokenizer, conv)


def parameter_counts(model: str) -> dict[str, int]:
    """Parameters of the checkpoint from its safetensors headers: all, and the language
    model's (those outside the vision tower), which every decode step reads; ``lm_bytes``:
    the bytes the checkpoint stores those in."""
    total = vision = lm_bytes = 0
    for path in resolve_model_path(model).glob("*.safetensors"):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= dim
            total += count
            if "visual" in name or "vision" in name:
                vision += count
            else:
                start, end = entry["data_offsets"]
                lm_bytes += end - start
    return {"params": total, "lm_params": total - vision, "lm_bytes": lm_bytes}
