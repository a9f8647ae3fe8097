"""The anyres fast path (``multimodal/fast_anyres``) against the LLaVA-OneVision and LLaVA-NeXT
PIL processors it replaces: bit-identical crops in "exact" mode for every grid, odd sizes and
image modes (OneVision's multi-image mode too: one padded square crop), and the processor for
settings it does not implement."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from mmserve.engine.setup.loading import build_model_config, load_image_processor
from mmserve.multimodal.image.anyres import hf_anyres
from mmserve.multimodal.image.fast import fast_image_processor
from mmserve.multimodal.image.fast_anyres import AnyresImageProcessing
from mmserve.multimodal.image.fast_pixels import FAST_RESIZE_MAX_LEVELS
from mmserve.multimodal.image.prep import ImagePreparer
from mmserve.multimodal.media.policy import MediaFetchPolicy
from tests.multimodal.test_fast_preprocessing import MODES, image_in_mode, picture

PRESETS = ["tiny-llava-onevision", "tiny-llava-next", "tiny-llava-onevision-small"]
SIZES = [(96, 80), (64, 64), (120, 50), (30, 200), (1280, 720), (1, 1), (500, 3), (3, 500)]


@pytest.fixture(scope="module", params=PRESETS)
def processor(request):
    return load_image_processor(build_model_config(request.param).path, {})


def hf_multi_image(processor, image):
    """The processor's crop of ``image`` as the first of two images of one sample."""
    out = processor(images=[[image, picture(0, (20, 30))]], return_tensors="np")
    return out["pixel_values"][0], tuple(int(x) for x in out["image_sizes"][0])


@pytest.mark.parametrize("size", SIZES)
def test_exact_multi_image_crop_is_the_processors(size):
    """OneVision's multi-image mode: padded to a square in the mean color, one crop."""
    processor = load_image_processor(build_model_config(PRESETS[0]).path, {})
    fast = fast_image_processor(processor, "exact")
    image = picture(7, size)
    mine, mine_size = fast.base_only(image, image.tobytes())
    theirs, their_size = hf_multi_image(processor, image)
    assert mine_size == their_size == (size[1], size[0])
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape == (1, 3, 32, 32)
    assert np.array_equal(mine, theirs)
    for mode in MODES:
        image = image_in_mode(3, (90, 40), mode)
        if fast.accepts(image):
            assert np.array_equal(fast.base_only(image)[0], hf_multi_image(processor, image)[0])


@pytest.mark.parametrize("size", SIZES)
def test_exact_crops_are_the_processors(processor, size):
    fast = fast_image_processor(processor, "exact")
    assert isinstance(fast, AnyresImageProcessing)
    image = picture(7, size)
    mine, mine_size = fast(image, image.tobytes())
    theirs, their_size = hf_anyres(processor, image)
    assert mine_size == their_size == (size[1], size[0])
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    assert np.array_equal(mine, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_exact_in_every_image_mode(processor, mode):
    fast = fast_image_processor(processor, "exact")
    image = image_in_mode(3, (90, 40), mode)
    if not fast.accepts(image):
        pytest.skip(f"{mode} goes to the processor")
    assert np.array_equal(fast(image)[0], hf_anyres(processor, image)[0])


def test_preparer_uses_the_fast_path_and_gives_the_processors_inputs():
    config = build_model_config("tiny-llava-onevision")
    processor = load_image_processor(config.path, {})
    preparer = ImagePreparer(config, processor, MediaFetchPolicy(), preprocessing="exact")
    hf = ImagePreparer(config, processor, MediaFetchPolicy(), preprocessing="hf")
    assert preparer.fast is not None and hf.fast is None
    image = picture(2, (120, 50))
    for multi_image in (False, True):
        mine, theirs = preparer.prepare(image, multi_image), hf.prepare(image, multi_image)
        assert mine.mm_hash == theirs.mm_hash and mine.length == theirs.length
        assert mine.multi_image == theirs.multi_image == multi_image
        assert np.array_equal(mine.data["pixel_values"], theirs.data["pixel_values"])
        assert (len(mine.data["pixel_values"]) == 1) == multi_image  # a grid has 1 + >= 1


@pytest.mark.parametrize(
    "edit",
    [
        {"do_resize": False},
        {"size": {"height": 32, "width": 48}},
        {"crop_size": {"height": 16, "width": 16}, "do_center_crop": True},
    ],
)
def test_settings_it_does_not_implement_go_to_the_processor(edit):
    processor = copy.deepcopy(
        load_image_processor(build_model_config("tiny-llava-onevision").path, {})
    )
    for name, value in edit.items():
        setattr(processor, name, value)
    assert fast_image_processor(processor, "exact") is None


def test_fast_mode_stays_within_the_stated_levels(processor):
    fast = fast_image_processor(processor, "fast")
    assert isinstance(fast, AnyresImageProcessing) and fast.pixels.resize_with_torch
    bound = FAST_RESIZE_MAX_LEVELS * processor.rescale_factor / min(processor.image_std)
    for size in SIZES:
        image = picture(5, size)
        mine, theirs = fast(image)[0], hf_anyres(processor, image)[0]
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= bound + 1e-6, size
        if type(processor).__name__.startswith("LlavaOnevision"):
            mine, theirs = fast.base_only(image)[0], hf_multi_image(processor, image)[0]
            assert np.abs(mine - theirs).max() <= bound + 1e-6, size
