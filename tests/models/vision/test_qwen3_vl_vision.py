"""Qwen3-VL's vision tower vs transformers' ``Qwen3VLVisionModel`` (float32): the merger's
output and every DeepStack merger's, concatenated per row as the encoder cache holds them;
and its image preprocessing (mmserve's fast path) vs the PIL image processor.

Like the other Qwen towers it runs its patch embedding as a matmul and batches equal attention
segments, so it must match within ``allclose(rtol=1e-4, atol=1e-4)``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration as HFQwen3VL

from mmserve.engine.setup.loading import build_model_config, load_image_processor
from mmserve.models.qwen3_vl import Qwen3VLForConditionalGeneration
from mmserve.multimodal.image.fast import fast_image_processor
from tests.support.images import make_image

TOL = {"rtol": 1e-4, "atol": 1e-4}
MODEL = "tiny-qwen3-vl"


@pytest.fixture(scope="module")
def qwen(qwen_tower_pair):
    return qwen_tower_pair(MODEL, Qwen3VLForConditionalGeneration, HFQwen3VL)


def hf_visual(hf: HFQwen3VL, items: list[dict]) -> list[torch.Tensor]:
    pixels = torch.cat([torch.as_tensor(d["pixel_values"]) for d in items])
    grid = torch.tensor([list(d["image_grid_thw"]) for d in items])
    out = hf.model.visual(pixels, grid_thw=grid)
    rows = torch.cat([out.pooler_output, *out.deepstack_features], dim=1)
    return list(rows.split((grid.prod(-1) // 4).tolist()))


@pytest.mark.parametrize(
    "sizes",
    [
        [(224, 224)],  # 14 x 14 patches resample the 4 x 4 position grid
        [(320, 480)],
        [(30, 20)],  # scaled up to min_pixels
        [(320, 480), (30, 20), (640, 360), (224, 224)],
        [(224, 224), (96, 80), (224, 224), (300, 120), (96, 80)],  # equal sizes apart
    ],
    ids=["square", "portrait", "tiny", "four-sizes", "repeated-sizes"],
)
def test_tower_matches_transformers(qwen, sizes):
    model, hf, prepare = qwen
    items = [prepare(size, seed) for seed, size in enumerate(sizes)]
    with torch.inference_mode():
        mine, ref = model.encode_images(items), hf_visual(hf, items)
    assert [t.shape for t in mine] == [t.shape for t in ref]
    assert mine[0].shape[1] == 3 * 128  # main embedding + 2 DeepStack features
    for a, b in zip(mine, ref, strict=True):
        assert torch.allclose(a, b, **TOL), (a - b).abs().max()


def test_images_attend_only_within_themselves(qwen):
    model, _, prepare = qwen
    items = [prepare((224, 224), 0), prepare((300, 120), 1), prepare((224, 224), 2)]
    with torch.inference_mode():
        together = model.encode_images(items)
        alone = [model.encode_images([item])[0] for item in items]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(a, b, **TOL)


@pytest.mark.parametrize("size", [(224, 224), (320, 480), (30, 20), (1280, 720)])
def test_fast_preprocessing_is_exact_for_qwen3_settings(size):
    """Qwen3-VL's processor settings (patch 16, mean / std 0.5) run mmserve's fast path, with
    pixel values bit-identical to the PIL image processor's."""
    proc = load_image_processor(build_model_config(MODEL).path, {})
    fast = fast_image_processor(proc, "exact")
    image = make_image(5, size)
    assert fast is not None and fast.accepts(image)
    patches, grid = fast(image)
    out = proc(images=image, return_tensors="np")
    assert grid == tuple(int(x) for x in out["image_grid_thw"][0])
    assert (patches == out["pixel_values"]).all()
