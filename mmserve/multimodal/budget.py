"""Encoder budgets autotuned from the model and scheduler configs."""

from __future__ import annotations

import logging

from mmserve.config import CacheConfig, ModelConfig, SchedulerConfig

logger = logging.getLogger(__name__)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def compute_encoder_budget(
    model_config: ModelConfig, scheduler_config: SchedulerConfig
) -> tuple[int, int]:
    """(encoder compute budget per step, encoder cache size), both in embeddings.

    The cache size returned is the floor one step needs; ``encoder_cache_capacity`` turns it into
    the default capacity that also keeps popular images between requests.
    """
    per_item = model_config.max_tokens_per_image
    limit = scheduler_config.max_images_per_prompt
    if per_item == 0 or limit == 0:
        logger.warning("all modalities are disabled (or the model has none): encoder cache is off")
        return 0, 0
    batch = scheduler_config.max_num_batched_tokens
    if per_item > batch:
        if scheduler_config.disable_chunked_mm_input:
            raise ValueError(
                f"an image can produce up to {per_item} embeddings, more than"
                f" max_num_batched_tokens={batch}, and chunked multimodal input is disabled:"
                f" raise max_num_batched_tokens to at least {per_item}"
            )
        items = 1
    else:
        items = _cdiv(batch, per_item)
    items += 1  # two requests sharing an image prefix may both need it in one step
    items = max(1, min(items, scheduler_config.max_num_seqs * limit))
    auto = items * per_item
    compute = _validated(
        "max_num_encoder_input_tokens", scheduler_config.max_num_encoder_input_tokens, per_item
    )
    cache = _validated("encoder_cache_size", scheduler_config.encoder_cache_size, per_item)
    return compute or auto, cache or auto


def _validated(name: str, value: int | None, per_item: int) -> int | None:
    if value is None:
        return None
    if value < per_item:
        raise ValueError(
            f"{name}={value} is smaller than the largest image ({per_item} embeddings):"
            f" such an image could never be encoded; use at least {per_item}"
        )
    return value


def encoder_cache_capacity(
    model_config: ModelConfig, scheduler_config: SchedulerConfig, cache_config: CacheConfig
) -> int:
    """Embeddings the encoder cache holds: an explicit ``encoder_cache_size`` as given, the
    per-step floor when cross-request caching is off, else the larger of the floor and what
    ``encoder_cache_memory`` holds at the model's width."""
    _, floor = compute_encoder_budget(model_config, scheduler_config)
    explicit = scheduler_config.encoder_cache_size is not None
    if explicit or floor == 0 or not cache_config.enable_encoder_cache:
        return floor
    per_embedding = model_config.bytes_per_embedding
    return max(floor, cache_config.encoder_cache_memory // max(per_embedding, 1))
