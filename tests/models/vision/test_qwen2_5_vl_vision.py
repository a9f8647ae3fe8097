"""Qwen2.5-VL's vision tower (window attention) vs transformers' (float32).

Like Qwen2-VL's (``test_vision_towers.py``) it runs its patch embedding as a matmul and batches
equal attention segments, so it must match within ``allclose(rtol=1e-4, atol=1e-4)`` on
embeddings of magnitude ~15.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration as HFQwen2_5_VL
from transformers.vision_utils import get_vision_window_index

from mmserve.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from mmserve.models.vision.qwen2_5_vl import window_layout

TOL = {"rtol": 1e-4, "atol": 1e-4}
MODEL = "tiny-qwen2.5-vl"


@pytest.fixture(scope="module")
def qwen(qwen_tower_pair):
    return qwen_tower_pair(MODEL, Qwen2_5_VLForConditionalGeneration, HFQwen2_5_VL)


def hf_visual(hf: HFQwen2_5_VL, items: list[dict]) -> list[torch.Tensor]:
    pixels = torch.cat([torch.as_tensor(d["pixel_values"]) for d in items])
    grid = torch.tensor([list(d["image_grid_thw"]) for d in items])
    merge = hf.config.vision_config.spatial_merge_size
    out = hf.model.visual(pixels, grid_thw=grid).pooler_output
    return list(out.split((grid.prod(-1) // merge**2).tolist()))


def assert_matches(mine: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    assert len(mine) == len(ref)
    for a, b in zip(mine, ref, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, **TOL), (a - b).abs().max()


@pytest.mark.parametrize(
    "sizes",
    [
        [(224, 224)],  # 8 x 8 merged patches: exactly 2 x 2 full windows
        [(320, 480)],  # 17 x 11 merged: partial windows on the right, the bottom, the corner
        [(30, 20)],  # 2 x 3: one partial window
        [(1280, 720)],  # capped by max_pixels: 12 x 21 merged
        [(320, 480), (30, 20), (640, 360), (224, 224)],
        [(224, 224), (96, 80), (224, 224), (300, 120), (96, 80)],  # equal sizes apart
    ],
    ids=["full-windows", "partial-windows", "one-window", "hd", "four-sizes", "repeated-sizes"],
)
def test_tower_matches_transformers(qwen, sizes):
    model, hf, prepare = qwen
    items = [prepare(size, seed) for seed, size in enumerate(sizes)]
    with torch.inference_mode():
        assert_matches(model.encode_images(items), hf_visual(hf, items))


def test_images_attend_only_within_themselves(qwen):
    model, _, prepare = qwen
    items = [prepare((224, 224), 0), prepare((300, 120), 1), prepare((224, 224), 2)]
    with torch.inference_mode():
        together = model.encode_images(items)
        alone = [model.encode_images([item])[0] for item in items]
    assert_matches(together, alone)


def test_video_grid_windows_per_frame(qwen):
    """A grid with t > 1: windows and full attention are per frame, as in transformers."""
    model, hf, _ = qwen
    vision = hf.config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = np.random.default_rng(0).standard_normal((2 * 10 * 12, width), dtype=np.float32)
    item = {"pixel_values": pixels, "image_grid_thw": (2, 10, 12)}
    with torch.inference_mode():
        assert_matches(model.encode_images([item]), hf_visual(hf, [item]))


def test_window_attention_is_not_full_attention(qwen):
    """The window layers matter: attending over whole images instead changes the output."""
    model, hf, prepare = qwen
    items = [prepare((320, 480), 0)]
    tower = model.visual
    saved = tower.full_attention
    tower.full_attention = frozenset(range(len(tower.blocks)))
    try:
        with torch.inference_mode():
            (mine,), (ref,) = model.encode_images(items), hf_visual(hf, items)
    finally:
        tower.full_attention = saved
    assert not torch.allclose(mine, ref, **TOL)


@pytest.mark.parametrize(
    "grids", [[(1, 16, 16)], [(1, 22, 34), (1, 4, 6)], [(2, 10, 12), (1, 8, 2)]]
)
def test_window_layout_has_transformers_windows(grids):
    """The same windows (as sets of merged patches) and frames as transformers' index; only
    the order of the windows within a frame differs."""
    layout = window_layout(grids, merge_size=2, window=4)
    index, cu = get_vision_window_index(
        torch.tensor(grids), spatial_merge_size=2, window_size=112, patch_size=14
    )
    lengths = (cu[1:] - cu[:-1]).div(4, rounding_mode="floor").tolist()
    theirs = {frozenset(w.tolist()) for w in index.split(lengths)}
    mine_lengths = [n // 4 for count, n in layout.windows for _ in range(count)]
    mine = {frozenset(w.tolist()) for w in layout.order.split(mine_lengths)}
    assert mine == theirs and len(mine_lengths) == len(lengths)
    frames = [n for count, n in layout.frames for _ in range(count)]
    assert frames == [h * w for t, h, w in grids for _ in range(t)]
    # every frame's windows stay inside the frame: full attention segments are contiguous
    starts = np.cumsum([0] + [n // 4 for n in frames])
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
        assert sorted(layout.order[lo:hi].tolist()) == list(range(lo, hi))
