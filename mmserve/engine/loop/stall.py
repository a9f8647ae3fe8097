"""The engine's stall limit, the policy that fails the request first in line
(``ProgressMonitor``), and the error that request ends with."""

from __future__ import annotations

from typing import Protocol

from mmserve.config import EngineConfig
from mmserve.core.kv_cache_manager import cdiv
from mmserve.core.progress import ProgressMonitor
from mmserve.core.scheduler import Scheduler
from mmserve.engine.loop.step_isolation import StepResult
from mmserve.engine.output.output_processor import OutputProcessor
from mmserve.engine.outputs import RequestOutput
from mmserve.request import Request, RequestStatus


class StallEngine(Protocol):
    """What the stall policy uses of an ``LLMEngine``."""

    config: EngineConfig
    scheduler: Scheduler
    progress: ProgressMonitor
    outputs: OutputProcessor


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


def fail_if_stalled(
    engine: StallEngine, result: StepResult, num_finished: int
) -> list[RequestOutput]:
    """The one stall policy (``ProgressMonitor``): fail the request first in line."""
    held = engine.scheduler.held_for_store > 0  # waiting on the store: bounded in time
    if not engine.progress.record(result.ran, num_finished, len(engine.scheduler.requests), held):
        return []
    stuck = engine.scheduler.head()
    if stuck is None:
        return []
    engine.scheduler.finish_requests([stuck.req_id], RequestStatus.FINISHED_ERROR)
    why = stall_message(stuck, engine.config, engine.scheduler, engine.progress.limit)
    return [engine.outputs.error_output(stuck, why)]
