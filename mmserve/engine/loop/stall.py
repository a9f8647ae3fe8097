"""The engine's stall limit and the error a stalled request ends with (``ProgressMonitor``)."""

from __future__ import annotations

from mmserve.config import EngineConfig
from mmserve.core.kv_cache_manager import cdiv
from mmserve.core.scheduler import Scheduler
from mmserve.request import Request


def default_stall_steps(config: EngineConfig) -> int:
    """Generously more steps than the progress argument in ``Scheduler`` needs before the
    oldest request gains a token: recompute a whole context and drain every running
    request's in-progress image, a few steps per image."""
    mc, sc = config.model, config.scheduler
    tokens = mc.max_model_len + sc.max_num_seqs * mc.max_tokens_per_image
    return 2 * (cdiv(tokens, sc.max_num_batched_tokens) + sc.max_images_per_prompt) + 64


def stall_message(request: Request, config: EngineConfig, scheduler: Scheduler, limit: int) -> str:
    """Why ``request``, first in line, ends: the limits one of which its input exceeds."""
    sc = config.scheduler
    return (
        f"no progress: no request's computed tokens advanced for {limit} steps and request"
        f" {request.req_id} ({request.num_tokens} tokens, {len(request.mm_items)} images)"
        f" was first in line. Limits: max_num_batched_tokens={sc.max_num_batched_tokens},"
        f" encoder cache {scheduler.encoder_cache.capacity} embeddings,"
        f" {scheduler.kv.pool.num_blocks} KV blocks, stall_steps={limit}; raise the one"
        " this input exceeds (this should not happen for validated settings: please report)"
    )
