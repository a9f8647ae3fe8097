"""Encoder budget autotuning rules (``mmserve.multimodal.budget``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mmserve.config import CacheConfig, ModelConfig, SchedulerConfig
from mmserve.engine_args import EngineArgs
from mmserve.multimodal.budget import compute_encoder_budget, encoder_cache_capacity


def sched(max_num_batched_tokens: int, **kwargs: object) -> SchedulerConfig:
    return EngineArgs(max_num_batched_tokens=max_num_batched_tokens, **kwargs).scheduler_config()  # type: ignore[arg-type]


def cache(**kwargs: object) -> CacheConfig:
    return EngineArgs(**kwargs).cache_config()  # type: ignore[arg-type]


def model(per_item: int, hidden: int = 64) -> ModelConfig:
    return ModelConfig(
        model="m",
        path=Path("."),
        architecture="X",
        hf_config=None,
        hidden_size=hidden,
        max_tokens_per_image=per_item,
    )


def test_items_from_batch_plus_one():
    # ceil(2048 / 576) = 4 items, + 1 extra = 5
    assert compute_encoder_budget(model(576), sched(2048)) == (5 * 576, 5 * 576)


def test_item_larger_than_batch_gives_one_plus_one():
    assert compute_encoder_budget(model(4096), sched(2048)) == (2 * 4096, 2 * 4096)


def test_item_larger_than_batch_without_chunked_mm_input_raises():
    config = sched(2048, disable_chunked_mm_input=True)
    with pytest.raises(ValueError, match="raise max_num_batched_tokens to at least 4096"):
        compute_encoder_budget(model(4096), config)


def test_capped_by_max_num_seqs_times_images_per_prompt():
    config = sched(8192, max_num_seqs=1, limit_mm_per_prompt={"image": 2})
    assert compute_encoder_budget(model(100), config) == (200, 200)


def test_never_below_one_item():
    config = sched(16, max_num_seqs=1, limit_mm_per_prompt={"image": 1})
    assert compute_encoder_budget(model(100), config) == (100, 100)


def test_images_disabled_gives_zero_and_warns(caplog):
    config = sched(2048, limit_mm_per_prompt={"image": 0})
    with caplog.at_level(logging.WARNING):
        assert compute_encoder_budget(model(576), config) == (0, 0)
    assert "encoder cache is off" in caplog.text


def test_overrides_are_used_and_validated():
    config = sched(2048, encoder_cache_size=1000, max_num_encoder_input_tokens=600)
    assert compute_encoder_budget(model(576), config) == (600, 1000)
    with pytest.raises(ValueError, match="encoder_cache_size=100"):
        compute_encoder_budget(model(576), sched(2048, encoder_cache_size=100))
    with pytest.raises(ValueError, match="max_num_encoder_input_tokens=5"):
        compute_encoder_budget(model(576), sched(2048, max_num_encoder_input_tokens=5))


def test_default_capacity_is_what_encoder_cache_memory_holds():
    mc, sc = model(576, hidden=1024), sched(2048)
    capacity = encoder_cache_capacity(mc, sc, cache(encoder_cache_memory=1 << 30))
    assert capacity == (1 << 30) // (1024 * 4)  # float32
    tiny = encoder_cache_capacity(mc, sc, cache(encoder_cache_memory=1024))
    assert tiny == 5 * 576  # never below the per-step floor
    explicit = sched(2048, encoder_cache_size=700)
    assert encoder_cache_capacity(mc, explicit, cache()) == 700
