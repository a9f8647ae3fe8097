"""Fast image preprocessing (``multimodal/fast_image_processing``) against the transformers
processors it replaces: "exact" gives bit-identical pixel values, "fast" stays within the
stated tolerance, every processor setting it does not implement falls back to the processor."""

from __future__ import annotations

import asyncio
import io
import pickle
from copy import deepcopy
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from transformers import CLIPImageProcessorPil, Qwen2VLImageProcessorPil

from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.setup.loading import load_image_processor
from mmserve.models.tiny import resolve_model_path
from mmserve.multimodal.hashing import hash_image
from mmserve.multimodal.image.decode import decode_image
from mmserve.multimodal.image.fast import fast_image_processor
from mmserve.multimodal.image.fast_clip import ClipImageProcessing
from mmserve.multimodal.image.fast_pixels import FAST_RESIZE_MAX_LEVELS
from mmserve.multimodal.image.fast_qwen2_vl import Qwen2VLImageProcessing
from mmserve.multimodal.image.prep import PREPROCESSING_ENV, ImagePreparer
from mmserve.multimodal.workers import MediaWorkers
from tests.support.images import make_image

SIZES = [(1280, 720), (720, 1280), (1920, 1080), (96, 80), (30, 20), (1, 1), (500, 3)]
MODES = ["RGB", "RGBA", "L", "P", "P+transparency", "LA", "RGB+transparency", "I;16"]


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    """``make_image``'s photo-like image; plain noise where it is too small for shapes."""
    if min(size) >= 4:
        return make_image(seed, size)
    noise = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(noise)


def image_in_mode(seed: int, size: tuple[int, int], mode: str) -> Image.Image:
    """A photo-like image in ``mode`` (alpha / transparency that actually varies)."""
    rgb = make_image(seed, size)
    rng = np.random.default_rng(seed)
    alpha = Image.fromarray(rng.integers(0, 256, size[::-1], dtype=np.uint8))
    if mode in ("RGBA", "LA"):
        image = rgb.convert(mode)
        image.putalpha(alpha)
        return image
    if mode == "P+transparency":
        image = rgb.convert("P")
        image.info["transparency"] = int(np.asarray(image)[0, 0])
        return image
    if mode == "RGB+transparency":
        image = rgb.copy()
        image.info["transparency"] = tuple(int(c) for c in np.asarray(rgb)[0, 0])
        return image
    if mode == "I;16":
        return Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257)
    return rgb.convert(mode)


def clip(**kwargs) -> CLIPImageProcessorPil:
    """The tiny-llava-small preset's processor (``kwargs`` as ``processor_kwargs``)."""
    base = {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}
    return CLIPImageProcessorPil(**{**base, **kwargs})


def qwen(**kwargs) -> Qwen2VLImageProcessorPil:
    """The released Qwen2-VL limits (tiny-qwen2-vl-small)."""
    return Qwen2VLImageProcessorPil(
        **{"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, **kwargs}
    )


def hf_output(processor, image: Image.Image):
    out = processor(images=image, return_tensors="np")
    if "image_grid_thw" in out:
        return out["pixel_values"], tuple(int(x) for x in out["image_grid_thw"][0])
    return out["pixel_values"][0], None


def fast_output(fast, image: Image.Image):
    out = fast(image)
    return out if isinstance(out, tuple) else (out, None)


def level(processor) -> float:
    """One uint8 level in pixel values: through rescale and std."""
    std = np.broadcast_to(np.asarray(processor.image_std if processor.do_normalize else 1.0), 3)
    return (processor.rescale_factor if processor.do_rescale else 1.0) / float(std.min())


def tolerance(processor) -> float:
    """The documented bound of the "fast" mode: 2 uint8 levels."""
    return FAST_RESIZE_MAX_LEVELS * level(processor) + 1e-5  # + float32 rounding


def assert_matches(processor, fast, image: Image.Image, mode: str) -> None:
    want, want_grid = hf_output(processor, image)
    got, got_grid = fast_output(fast, image)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    assert got_grid == want_grid
    if mode == "exact":
        assert np.array_equal(got, want)
    else:
        diff = np.abs(got - want)
        assert diff.max() <= tolerance(processor), diff.max()
        assert diff.mean() <= 0.1 * level(processor)  # a level off on a few values only


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("make", [clip, qwen], ids=["clip", "qwen2_vl"])
def test_pixel_values_match_the_processor(make, size, mode):
    processor = make()
    fast = fast_image_processor(processor, mode)
    assert fast is not None
    assert_matches(processor, fast, picture(sum(size), size), mode)


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("image_mode", MODES)
@pytest.mark.parametrize("make", [clip, qwen], ids=["clip", "qwen2_vl"])
def test_non_rgb_modes_convert_like_the_processor(make, image_mode, mode):
    """Alpha and palette transparency are composited onto white, as the processor does."""
    processor = make()
    assert_matches(
        processor,
        fast_image_processor(processor, mode),
        image_in_mode(3, (97, 61), image_mode),
        mode,
    )


OVERRIDES = {
    "clip": [
        {"size": 100, "crop_size": 50},
        {"size": {"height": 64, "width": 96}, "do_center_crop": False},
        {"crop_size": {"height": 300, "width": 180}},  # crop larger than the resize: zero pad
        {"resample": Image.Resampling.BILINEAR},
        {"resample": Image.Resampling.NEAREST},
        {"resample": Image.Resampling.LANCZOS},
        {"do_resize": False},
        {"image_mean": 0.5, "image_std": 0.5},
        {"do_normalize": False},
        {"do_rescale": False},
        {"rescale_factor": 1 / 127.5, "image_mean": [1.0, 1.0, 1.0], "image_std": [1.0, 1.0, 1.0]},
        {"rescale_factor": 0.003},  # no float32 division equals its float64 product
    ],
    "qwen2_vl": [
        {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64},
        {"size": {"shortest_edge": 512 * 512, "longest_edge": 1024 * 1024}},
        {"patch_size": 16, "merge_size": 1, "temporal_patch_size": 3},
        {"resample": Image.Resampling.BILINEAR},
        {"resample": Image.Resampling.BOX},
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": False},
        {"do_normalize": False},
        {"rescale_factor": 0.003},
    ],
}


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize(
    "make,kwargs",
    [(clip, kw) for kw in OVERRIDES["clip"]] + [(qwen, kw) for kw in OVERRIDES["qwen2_vl"]],
)
def test_processor_kwargs_are_respected(make, kwargs, mode):
    processor = make(**kwargs)
    fast = fast_image_processor(processor, mode)
    assert fast is not None
    for size in [(640, 360), (83, 129)]:
        assert_matches(processor, fast, make_image(7, size), mode)


def test_rescale_runs_in_float32_only_where_that_is_exact():
    assert fast_image_processor(clip()).pixels.rescale_divisor == 255.0
    assert fast_image_processor(clip(rescale_factor=0.003)).pixels.rescale_divisor is None


def test_settings_come_from_the_checkpoint_and_processor_kwargs():
    path = resolve_model_path("tiny-qwen2-vl")
    fast = fast_image_processor(load_image_processor(path, {}))
    assert isinstance(fast, Qwen2VLImageProcessing)
    assert (fast.min_pixels, fast.max_pixels) == (56 * 56, 448 * 448)  # preprocessor_config.json
    kwargs = {"min_pixels": 28 * 28 * 8, "max_pixels": 28 * 28 * 32}
    fast = fast_image_processor(load_image_processor(path, kwargs))
    assert (fast.min_pixels, fast.max_pixels) == (28 * 28 * 8, 28 * 28 * 32)
    fast = fast_image_processor(load_image_processor(resolve_model_path("tiny-llava"), {}))
    assert isinstance(fast, ClipImageProcessing)
    assert (fast.shortest_edge, fast.crop, fast.pixels.resample) == (64, (64, 64), 3)
    assert not fast.pixels.resize_with_torch  # "exact" by default: PIL's own resize


UNSUPPORTED = [
    clip(do_pad=True, pad_size={"height": 256, "width": 256}),
    clip(size={"shortest_edge": 200, "longest_edge": 300}),
    clip(size={"max_height": 200, "max_width": 300}),
    clip(do_rescale=False, do_normalize=False),  # uint8 output
    clip(image_mean=[0.5, 0.5]),
    qwen(do_resize=False),
]


@pytest.mark.parametrize("processor", UNSUPPORTED, ids=range(len(UNSUPPORTED)))
def test_unsupported_settings_have_no_fast_path(processor):
    assert fast_image_processor(processor, "fast") is None
    assert fast_image_processor(processor, "exact") is None


def test_hf_mode_and_unknown_processors_have_no_fast_path():
    assert fast_image_processor(clip(), "hf") is None
    assert fast_image_processor(None) is None

    class Custom(CLIPImageProcessorPil):  # may preprocess differently: not ours to redo
        pass

    assert fast_image_processor(Custom()) is None
    with pytest.raises(ValueError, match="one of"):
        fast_image_processor(clip(), "quick")


def test_fast_processors_pickle():
    for fast in (fast_image_processor(clip()), fast_image_processor(qwen())):
        copy = pickle.loads(pickle.dumps(fast))
        assert copy == fast
        image = make_image(1, (300, 200))
        np.testing.assert_array_equal(fast_output(copy, image)[0], fast_output(fast, image)[0])


# ---- ImagePreparer: the fast path by default, the HF processor where it must -------------------
def jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module", params=["tiny-llava", "tiny-qwen2-vl"])
def engine(request):
    return LLMEngine.from_args(request.param)


def preparer(engine, image_processor=None, preprocessing=None) -> ImagePreparer:
    old = engine.processor.preparer
    processor = old.image_processor if image_processor is None else image_processor
    return ImagePreparer(old.model_config, processor, old.media_policy, preprocessing)


def arrays(data):
    return [np.asarray(v) for v in data.values()] if isinstance(data, dict) else [data]


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_preparer_matches_the_hf_path_and_keeps_the_hash(engine, mode):
    hf = preparer(engine, preprocessing="hf")
    ours = preparer(engine, preprocessing=mode)
    assert hf.fast is None and ours.fast is not None
    sources = [jpeg(make_image(1, (1280, 720))), png(image_in_mode(2, (90, 70), "RGBA"))]
    for raw in [*sources, image_in_mode(3, (64, 200), "P")]:
        want, got = hf.prepare(raw), ours.prepare(raw)
        image = decode_image(raw) if isinstance(raw, bytes) else raw.convert("RGB")
        mc = engine.processor.model_config
        assert got.mm_hash == want.mm_hash == hash_image(image, mc.model, mc.processor_kwargs)
        assert (got.length, got.size) == (want.length, want.size)
        for a, b in zip(arrays(got.data), arrays(want.data), strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            if mode == "exact" or a.dtype != np.float32:
                assert np.array_equal(a, b)
            else:
                assert np.abs(a - b).max() <= tolerance(hf.image_processor)


def test_preparer_falls_back_to_the_processor(engine):
    """A setting the fast path does not implement: the preparer runs the HF processor."""
    image_processor = deepcopy(engine.processor.preparer.image_processor)
    if isinstance(image_processor, CLIPImageProcessorPil):
        image_processor.do_pad, image_processor.pad_size = True, {"height": 80, "width": 80}
    else:
        image_processor.do_resize = False  # sizes must then be multiples of patch x merge
    fallback = preparer(engine, image_processor)
    assert fallback.fast is None
    image = make_image(4, (56, 84))
    got = fallback.prepare(png(image))
    want = fallback.image_inputs.hf(image_processor, image)
    want = fallback.image_inputs.inputs(want, image_processor, engine.processor.model_config)
    assert got.length == want[1]
    for a, b in zip(arrays(got.data), arrays(want[0]), strict=True):
        assert np.array_equal(a, b)
    if image_processor.do_pad:
        assert got.data.shape == (3, 80, 80)


def test_preprocessing_mode_from_argument_and_environment(engine, monkeypatch):
    monkeypatch.delenv(PREPROCESSING_ENV, raising=False)
    assert preparer(engine).preprocessing == "exact"  # the default: bit-identical
    assert not preparer(engine).fast.pixels.resize_with_torch
    monkeypatch.setenv(PREPROCESSING_ENV, "fast")  # opt-in
    assert preparer(engine).preprocessing == "fast"
    assert preparer(engine).fast.pixels.resize_with_torch
    assert preparer(engine, preprocessing="hf").fast is None  # the argument wins
    monkeypatch.setenv(PREPROCESSING_ENV, "")
    assert preparer(engine).preprocessing == "exact"
    monkeypatch.setenv(PREPROCESSING_ENV, "turbo")
    with pytest.raises(ValueError, match=PREPROCESSING_ENV):
        preparer(engine)
    with pytest.raises(ValueError, match="preprocessing must be one of"):
        preparer(engine, preprocessing="FAST")


def test_media_workers_use_the_preparers_mode(engine):
    """Worker processes rebuild the preparer with its mode (not the environment's default)."""
    fast = preparer(engine, preprocessing="fast")
    workers = MediaWorkers(
        SimpleNamespace(preparer=fast, video_loader=engine.processor.video_loader),
        1,  # type: ignore[arg-type]
    )
    raw = jpeg(make_image(1, (320, 200)))
    try:
        got = asyncio.run(workers.run(raw))
    finally:
        workers.shutdown()
    want, exact = fast.prepare(raw), preparer(engine, preprocessing="exact").prepare(raw)
    got_arrays = arrays(got.data)
    assert all(map(np.array_equal, got_arrays, arrays(want.data)))
    assert not all(map(np.array_equal, got_arrays, arrays(exact.data)))  # the mode shows
