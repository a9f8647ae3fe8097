"""The engine's decode graphs: whether the model can run them, and their capture at start-up,
after the KV cache is allocated and before any request. A failed capture is one warning line
and an eager engine, never a failed start."""

from __future__ import annotations

import logging

import torch

from mmserve.config import EngineConfig
from mmserve.graph_config import DecodeGraphConfig
from mmserve.layers.attention import PagedKVCache
from mmserve.models.interface import VisionLanguageModel
from mmserve.worker.cuda_graphs import DecodeGraphs

logger = logging.getLogger(__name__)
MiB = 1 << 20


def usable_graph_config(
    config: EngineConfig, model: VisionLanguageModel
) -> DecodeGraphConfig | None:
    """``config.decode_graphs``, unless the model needs attention masks (sliding windows,
    bidirectional images) that only the eager torch path has."""
    graphs = config.decode_graphs
    if graphs is not None and model.attention_masks is not None:
        logger.info("decode graphs: off, the model needs %s", model.attention_masks)
        return None
    return graphs


def build_decode_graphs(
    config: DecodeGraphConfig | None,
    model: VisionLanguageModel,
    cache: PagedKVCache,
    pad_block: int,
    device: torch.device,
) -> DecodeGraphs | None:
    """The graphs over ``cache`` (whose block ``pad_block`` the scheduler never hands out),
    captured when ``config.capture``; None when there are none or their capture failed."""
    if config is None:
        return None
    graphs: DecodeGraphs | None = None
    try:
        reserved = torch.cuda.memory_reserved(device) if config.capture else 0
        graphs = DecodeGraphs(model, cache, config, pad_block, device)
        if config.capture:
            graphs.capture()
    except Exception as exc:  # a failed capture must cost speed, not the engine
        why = (str(exc).splitlines() or [""])[0][:300]
        logger.warning("CUDA graphs: capture failed, decode runs eagerly (%s: %s)",
                       type(exc).__name__, why)  # fmt: skip
        if graphs is not None:
            graphs.release()
        return None
    if not config.capture:
        logger.info("decode: the padded static-shape path, no capture (%s)", config.describe())
        return graphs
    held = torch.cuda.memory_reserved(device) - reserved
    logger.info(
        "CUDA graphs: %d decode graphs (%s) captured in %.2f s, %.0f MiB held",
        graphs.num_graphs,
        config.describe(),
        graphs.capture_seconds,
        held / MiB,
    )
    return graphs
