"""Measure what the model needs on the device before the KV cache is sized (CUDA).

One profiling pass runs what a step can run at most: an LM prefill of the whole token budget
(logits for ``max_num_seqs`` rows) and one encoder batch of the whole encoder budget (a
1024 x 1024 dummy image, repeated). The allocator's peak above the weights is the activation
headroom ``MemoryPlan`` keeps free. With decode graphs, a second pass runs their largest
bucket eagerly: the graphs are captured after the KV cache is allocated (they read it), so
their memory is planned from this pass. The probe is an interface so the pass itself is
tested on CPU with a fake one.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from PIL import Image

from mmserve.config import EngineConfig
from mmserve.engine.setup.loading import torch_dtype
from mmserve.engine.setup.memory_plan import DeviceMemoryUsage, MemoryPlan
from mmserve.graph_config import DecodeGraphConfig
from mmserve.layers.attention import AttentionMetadata, PagedKVCache
from mmserve.models.interface import VisionLanguageModel
from mmserve.worker.cuda_graphs import DecodeGraphs

logger = logging.getLogger(__name__)

DUMMY_IMAGE_SIDE = 1024


class MemoryProbe(Protocol):
    """The allocator and device figures a profiling pass reads (bytes)."""

    def free_and_total(self) -> tuple[int, int]: ...

    def reserved(self) -> int: ...

    def allocated(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak_allocated(self) -> int: ...


class CudaMemoryProbe:
    """``MemoryProbe`` of one CUDA device (torch's caching allocator)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def free_and_total(self) -> tuple[int, int]:
        torch.cuda.synchronize(self.device)
        return torch.cuda.mem_get_info(self.device)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


def profile_memory(
    model: VisionLanguageModel,
    probe: MemoryProbe,
    *,
    num_tokens: int,
    num_logit_rows: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    dummy_image_data: list[Any],
    decode_graphs: DecodeGraphConfig | None = None,
) -> DeviceMemoryUsage:
    """Run the profiling pass and read the probe around it (the weights are loaded)."""
    free, total = probe.free_and_total()
    weights = probe.allocated()
    used_elsewhere = max(0, total - free - probe.reserved())
    num_blocks = -(-num_tokens // block_size)
    cache = PagedKVCache(
        model.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim, dtype, device
    )
    base = probe.allocated()  # the scratch KV cache is not an activation: measured above it
    probe.reset_peak()
    with torch.inference_mode():
        _lm_prefill(model, cache, num_tokens, num_logit_rows, device)
        if dummy_image_data:
            model.encode_images(dummy_image_data)
    peak = probe.peak_allocated()
    graphs = 0
    if decode_graphs is not None:
        pad_block = PagedKVCache.bytes_per_block(
            model.num_layers, block_size, model.num_kv_heads, model.head_dim, dtype.itemsize
        )
        graphs = pad_block + _graph_memory(model, cache, decode_graphs, probe, device)
    return DeviceMemoryUsage(total, used_elsewhere, weights, max(0, peak - base), graphs)


def _graph_memory(
    model: VisionLanguageModel,
    cache: PagedKVCache,
    config: DecodeGraphConfig,
    probe: MemoryProbe,
    device: torch.device,
) -> int:
    """The graphs' buffers and the largest bucket's peak: the pool the graphs share, captured
    largest first (block 0 of the scratch cache stands in for the pad block)."""
    base = probe.allocated()
    probe.reset_peak()
    graphs = DecodeGraphs(model, cache, config, 0, device)
    with torch.inference_mode():
        graphs.run_largest()
    used = probe.peak_allocated() - base
    del graphs
    return max(0, used)


def _lm_prefill(
    model: VisionLanguageModel,
    cache: PagedKVCache,
    num_tokens: int,
    num_logit_rows: int,
    device: torch.device,
) -> None:
    """One sequence of ``num_tokens`` through the LM over ``cache`` (just large enough)."""
    block_size = cache.block_size
    num_blocks = -(-num_tokens // block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens, device=device),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        block_size=block_size,
        query_lens_host=[num_tokens],
        seq_lens_host=[num_tokens],
        use_kernel=False,
    )
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    if model.uses_mrope:
        positions = torch.arange(num_tokens, device=device).expand(3, -1)
    else:
        positions = torch.arange(num_tokens, device=device)
    hidden = model(model.embed(ids), positions, cache, meta)
    model.compute_logits(hidden[-min(num_logit_rows, num_tokens) :])


def dummy_image_data(prepare: Any, encoder_budget: int) -> list[Any]:
    """Processor outputs of a 1024 x 1024 image, as many as fit the encoder budget (at least
    one); ``prepare`` is ``InputProcessor.prepare_image``."""
    prepared = prepare(Image.new("RGB", (DUMMY_IMAGE_SIDE, DUMMY_IMAGE_SIDE), (128, 128, 128)))
    return [prepared.data] * max(1, encoder_budget // max(1, prepared.length))


def num_kv_blocks(
    config: EngineConfig,
    model: VisionLanguageModel,
    device: torch.device,
    encoder_cache_capacity: int,
    encoder_budget: int,
    processor: Any,
    probe: MemoryProbe | None = None,
    decode_graphs: DecodeGraphConfig | None = None,
) -> int:
    """``num_kv_blocks`` when set; on CUDA (or with a ``probe``) what the device's memory
    leaves after a profiling pass (``MemoryPlan``, logged; ``decode_graphs`` counted); on CPU
    what ``kv_cache_memory`` holds. Always at most max_num_seqs full-length sequences (the
    graphs' pad block comes on top)."""
    cc, mc, sc = config.cache, config.model, config.scheduler
    if cc.num_kv_blocks is not None:
        return cc.num_kv_blocks
    per_block = PagedKVCache.bytes_per_block(
        model.num_layers, cc.block_size, model.num_kv_heads, model.head_dim, mc.dtype_bytes
    )
    wanted = sc.max_num_seqs * -(-mc.max_model_len // cc.block_size)
    if probe is None and device.type != "cuda":
        blocks = max(1, min(wanted, cc.kv_cache_memory // per_block))
        logger.info(
            "KV cache: %d blocks (%d tokens, %.0f MiB) on %s, from kv_cache_memory",
            blocks, blocks * cc.block_size, blocks * per_block / (1 << 20), device,
        )  # fmt: skip
        return blocks
    images = (
        dummy_image_data(processor.prepare_image, encoder_budget)
        if processor.preparer.accepts_images
        else []
    )
    usage = profile_memory(
        model,
        probe or CudaMemoryProbe(device),
        num_tokens=sc.max_num_batched_tokens,
        num_logit_rows=sc.max_num_seqs,
        block_size=cc.block_size,
        dtype=torch_dtype(mc.dtype),
        device=device,
        dummy_image_data=images,
        decode_graphs=decode_graphs,
    )
    encoder_cache_bytes = encoder_cache_capacity * mc.bytes_per_embedding
    plan = MemoryPlan.of(
        usage, config.gpu_memory_utilization, encoder_cache_bytes, per_block, wanted
    )
    logger.info(plan.summary(cc.block_size))
    return plan.num_kv_blocks
