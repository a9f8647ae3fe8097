"""Fixtures of the vision-tower tests: the Qwen family's towers, mmserve's and transformers'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mmserve.engine.setup.loading import build_model_config, load_image_processor
from mmserve.multimodal.image.prep import IMAGE_INPUTS
from tests.support.images import make_image


def _qwen_tower_pair(preset: str, ours: type, theirs: Any) -> tuple[Any, Any, Callable]:
    cfg = build_model_config(preset)
    model = ours(cfg.hf_config).eval()
    model.load_weights(cfg.path)
    hf = theirs.from_pretrained(cfg.path, dtype=torch.float32).eval()
    proc = load_image_processor(cfg.path, {})
    glue = IMAGE_INPUTS[cfg.architecture]

    def prepare(size: tuple[int, int], seed: int) -> dict:
        return glue.inputs(glue.hf(proc, make_image(seed, size)), proc, cfg)[0]

    return model, hf, prepare


@pytest.fixture(scope="session")
def qwen_tower_pair() -> Callable[[str, type, Any], tuple[Any, Any, Callable]]:
    """``qwen_tower_pair(preset, ours, theirs)``: (our model with the preset's weights,
    transformers' model, ``prepare(size, seed)``: the image inputs of a test image as admission
    builds them); a module's fixture builds the pair once for its tests."""
    return _qwen_tower_pair
