"""The engine's caches, sized and built: the paged KV cache on the device, and the scheduler
whose managers hand out its blocks and the encoder cache's embeddings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.core.kv_cache_manager import KVCacheManager
from mmserve.core.scheduler import Scheduler
from mmserve.engine.setup.loading import torch_dtype
from mmserve.engine.setup.memory_profile import num_kv_blocks
from mmserve.graph_config import DecodeGraphConfig
from mmserve.layers.attention import PagedKVCache
from mmserve.models.interface import VisionLanguageModel
from mmserve.multimodal.budget import compute_encoder_budget, encoder_cache_capacity


@dataclass(frozen=True)
class CacheSizes:
    """What the memory plan settled; ``num_kv_blocks`` always holds one ``max_model_len``
    sequence (``size_caches`` refuses a plan that does not)."""

    num_kv_blocks: int
    encoder_cache_capacity: int  # embeddings
    encoder_budget: int  # embeddings the vision encoder may compute per step


def size_caches(
    config: EngineConfig,
    model: VisionLanguageModel,
    device: torch.device,
    processor: Any,
    decode_graphs: DecodeGraphConfig | None = None,
) -> CacheSizes:
    """Size the caches (``num_kv_blocks`` may run a profiling pass on CUDA, which counts the
    ``decode_graphs``); ValueError when the KV cache cannot hold ``max_model_len`` tokens."""
    mc, sc, cc = config.model, config.scheduler, config.cache
    encoder_budget, _ = compute_encoder_budget(mc, sc)
    capacity = encoder_cache_capacity(mc, sc, cc)
    num_blocks = num_kv_blocks(
        config, model, device, capacity, encoder_budget, processor, None, decode_graphs
    )
    if mc.max_model_len > num_blocks * cc.block_size:
        raise ValueError(
            f"max_model_len={mc.max_model_len} is more than the KV cache holds"
            f" ({num_blocks} blocks x {cc.block_size} = {num_blocks * cc.block_size} tokens):"
            " lower max_model_len or raise num_kv_blocks / kv_cache_memory"
        )
    return CacheSizes(num_blocks, capacity, encoder_budget)


def allocate_kv_cache(
    config: EngineConfig, model: VisionLanguageModel, device: torch.device, num_blocks: int
) -> PagedKVCache:
    return PagedKVCache(
        model.num_layers,
        num_blocks,
        config.cache.block_size,
        model.num_kv_heads,
        model.head_dim,
        torch_dtype(config.model.dtype),
        device,
    )


def build_scheduler(config: EngineConfig, sizes: CacheSizes) -> Scheduler:
    mc, sc, cc = config.model, config.scheduler, config.cache
    return Scheduler(
        KVCacheManager(
            sizes.num_kv_blocks,
            cc.block_size,
            cc.enable_prefix_caching,
            cc.prefix_caching_hash_algo,
            cc.prefix_caching_seed,
        ),
        EncoderCacheManager(
            sizes.encoder_cache_capacity, mc.bytes_per_embedding, cc.enable_encoder_cache
        ),
        max_num_batched_tokens=sc.max_num_batched_tokens,
        max_num_seqs=sc.max_num_seqs,
        encoder_compute_budget=sizes.encoder_budget,
        disable_chunked_mm_input=sc.disable_chunked_mm_input,
    )
