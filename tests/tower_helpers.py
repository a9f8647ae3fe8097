"""Vision-tower tests of the Qwen family: mmserve's model and transformers' on one preset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mmserve.engine.setup.loading import build_model_config, load_image_processor
from mmserve.multimodal.image.prep import IMAGE_INPUTS
from tests.conftest import make_image


def qwen_tower_pair(preset: str, ours: type, theirs: Any) -> tuple[Any, Any, Callable]:
    """(our model with the preset's weights, transformers' model, ``prepare(size, seed)``: the
    image inputs of a test image as admission builds them)."""
    cfg = build_model_config(preset)
    model = ours(cfg.hf_config).eval()
    model.load_weights(cfg.path)
    hf = theirs.from_pretrained(cfg.path, dtype=torch.float32).eval()
    proc = load_image_processor(cfg.path, {})
    glue = IMAGE_INPUTS[cfg.architecture]

    def prepare(size: tuple[int, int], seed: int) -> dict:
        return glue.inputs(glue.hf(proc, make_image(seed, size)), proc, cfg)[0]

    return model, hf, prepare
