"""Qwen video pieces without the engine loop: preprocessing vs transformers' video processor
code, frame-group items and keys, M-RoPE vs ``get_rope_index``, and per-group encoding vs
transformers' vision tower over the whole video."""

from __future__ import annotations

import ast
import inspect
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoConfig, Qwen2VLImageProcessorPil
from transformers.image_processing_backends import TorchvisionBackend
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl

from mmserve.config import ModelConfig
from mmserve.engine.setup.loading import build_model_config, load_model
from mmserve.inputs import VideoFrames
from mmserve.models.tiny import QWEN_SPECIAL_TOKEN_IDS, resolve_model_path
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.video.inputs import VideoInputs
from mmserve.multimodal.video.prep import prepare_video, video_frames
from mmserve.multimodal.video.qwen2_vl import load_video_settings, preprocess_video
from mmserve.multimodal.video.sampling import VideoSampling
from mmserve.multimodal.video.source import VideoLoader
from tests.support.images import make_image

MODELS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]
IMAGE_PAD = QWEN_SPECIAL_TOKEN_IDS["<|image_pad|>"]
VIDEO_PAD = QWEN_SPECIAL_TOKEN_IDS["<|video_pad|>"]


def make_video(seed: int, num_frames: int, size: tuple[int, int]) -> np.ndarray:
    """[T, H, W, 3] uint8 frames that differ from frame to frame."""
    return np.stack([np.asarray(make_image(seed * 100 + i, size)) for i in range(num_frames)])


def transformers_function(module: Any, qualname: str) -> Any:
    """A function from transformers' source, compiled alone: its video processor module
    imports torchvision (absent here), but ``patchify`` is plain torch."""
    source = Path(inspect.getfile(image_processing_pil_qwen2_vl)).with_name(
        "video_processing_qwen2_vl.py"
    )
    cls_name, fn_name = qualname.split(".")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == fn_name:
                    fn.decorator_list = []
                    namespace: dict[str, Any] = {"torch": torch}
                    code = ast.Module(body=[fn], type_ignores=[])
                    exec(compile(code, str(source), "exec"), namespace)  # noqa: S102
                    return namespace[fn_name]
    raise LookupError(qualname)


@pytest.mark.parametrize("num_frames", [5, 6])
def test_preprocessing_matches_transformers_video_processor(num_frames):
    settings = load_video_settings(resolve_model_path("tiny-qwen2-vl"))
    frames = make_video(1, num_frames, (150, 100))
    mine, grid = preprocess_video(frames, settings)
    # transformers' steps: torchvision's CPU uint8 resize call, its fused rescale+normalize,
    # the video processor's own patchify (with its odd-frame padding)
    video = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
    height, width = image_processing_pil_qwen2_vl.smart_resize(100, 150, 28, 3136, 200704)
    video = torch.nn.functional.interpolate(
        video, size=(height, width), mode="bicubic", align_corners=False, antialias=True
    )
    fuse = TorchvisionBackend._fuse_mean_std_and_rescale_factor.__wrapped__
    mean, std, _ = fuse(None, True, list(settings.mean), list(settings.std), True, 1 / 255)
    values = video.to(torch.float32).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    patchify = transformers_function(None, "Qwen2VLVideoProcessor.patchify")
    expected, gt, gh, gw = patchify(None, values[None], 14, 2, 2)
    assert grid == (gt, gh, gw) == (3, height // 14, width // 14)
    assert np.array_equal(mine, expected[0].numpy())


def test_static_video_matches_image_processor():
    # two equal frames at a size smart_resize keeps: the image processor's patches (the
    # frame repeated temporal_patch_size times), up to its unfused float arithmetic
    path = resolve_model_path("tiny-qwen2-vl")
    frame = make_image(3, (84, 56))
    mine, grid = preprocess_video(np.stack([np.asarray(frame)] * 2), load_video_settings(path))
    out = Qwen2VLImageProcessorPil.from_pretrained(path)(images=frame, return_tensors="np")
    assert grid == tuple(out["image_grid_thw"][0])
    np.testing.assert_allclose(mine, out["pixel_values"], atol=1e-5)


def test_settings_follow_transformers_file_order_and_kwargs(tmp_path):
    path = resolve_model_path("tiny-qwen2-vl")
    base = load_video_settings(path)
    assert (base.min_pixels, base.max_pixels) == (56 * 56, 448 * 448)  # preprocessor_config
    assert load_video_settings(path, {"max_pixels": 112 * 112}).max_pixels == 112 * 112
    (tmp_path / "preprocessor_config.json").write_text(
        (path / "preprocessor_config.json").read_text()
    )
    video = {"size": {"shortest_edge": 100, "longest_edge": 200000}, "temporal_patch_size": 2}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    assert load_video_settings(tmp_path).min_pixels == 100
    nested = {"video_processor": {"max_pixels": 300000}}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    assert load_video_settings(tmp_path).max_pixels == 300000
    with pytest.raises(ValueError, match="resample"):
        load_video_settings(path, {"resample": 1})


def test_frame_group_items_and_keys():
    settings = load_video_settings(resolve_model_path("tiny-qwen2-vl"))
    frames = make_video(2, 7, (112, 56))  # 7 frames -> 4 groups (last frame repeated)
    video = prepare_video(VideoFrames(frames, 4.0, tuple(i / 4 for i in range(7))), "m", settings)
    items = video.items(10)
    assert video.grid == (4, 4, 8) and video.second_per_grid_t == 0.5
    assert [(i.offset, i.length) for i in items] == [(10 + 8 * g, 8) for g in range(4)]
    assert [i.video.index for i in items if i.video] == [0, 1, 2, 3]
    assert len({i.key for i in items}) == 4
    for g, item in enumerate(items):
        assert item.data["image_grid_thw"] == (1, 4, 8)
        assert np.array_equal(item.data["pixel_values"], video.pixel_values[32 * g : 32 * g + 32])
    same = prepare_video(list(map(_pil, frames)), "m", settings)  # PIL frames, default fps 2
    assert same.second_per_grid_t == 1.0
    assert same.mm_hash != video.mm_hash  # fps is part of the key (positions depend on it)
    again = prepare_video(VideoFrames(frames, 4.0, tuple(i / 4 for i in range(7))), "m", settings)
    assert [i.key for i in again.items(0)] == [i.key for i in items]  # offset-free keys
    salted = again.items(0, cache_salt="tenant")
    assert not {i.key for i in salted} & {i.key for i in items}


def _pil(frame: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(frame)


@pytest.mark.parametrize(
    "bad, match",
    [
        ("clip.mp4", "must be decoded first"),
        (b"\x00\x00", "must be decoded first"),
        (np.zeros((2, 8, 8), np.uint8), r"\[T, H, W, 3\] uint8"),
        (np.zeros((0, 8, 8, 3), np.uint8), "no pixels"),
        (np.zeros((2, 8, 8, 3), np.float32), "uint8"),
        (VideoFrames(np.zeros((2, 8, 8, 3), np.uint8), 0.0, ()), "fps"),
        (VideoFrames(np.zeros((2, 8, 8, 3), np.uint8), 2.0, (0.0,)), "timestamps"),
        ([], "PIL images"),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8)], "differ in shape"),
    ],
)
def test_bad_videos_are_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        video_frames(bad)


def video_inputs(config: ModelConfig) -> VideoInputs:
    """One video per prompt, Qwen2-VL's default sampling (frames given are all used)."""
    return VideoInputs(config, 1, VideoLoader(MediaFetchPolicy(), VideoSampling()))


def test_video_longer_than_max_model_len_is_refused_before_preprocessing():
    config = build_model_config("tiny-qwen2-vl", max_model_len=64)
    videos = video_inputs(config)
    with pytest.raises(ValueError, match="64 frames of 112x112 needs 512 tokens"):
        videos.prepare(make_video(4, 64, (112, 112)))
    with pytest.raises(ValueError, match="2 videos exceed the limit of 1"):
        videos.check_count(2)


# ---- M-RoPE and the vision tower vs transformers ------------------------------------------
@pytest.fixture(scope="module", params=MODELS)
def pair(request) -> tuple[ModelConfig, Any, Any]:
    """(model config, mmserve model, transformers model) of one preset."""
    config = build_model_config(request.param)
    hf_class = getattr(transformers, AutoConfig.from_pretrained(config.path).architectures[0])
    hf = hf_class.from_pretrained(config.path, dtype=torch.float32).eval()
    return config, load_model(config, torch.device("cpu")), hf


@pytest.mark.parametrize("seed", range(4))
def test_mrope_positions_match_get_rope_index(pair, seed):
    config, model, hf = pair
    settings = load_video_settings(config.path)
    rng = random.Random(seed)
    ids: list[int] = []
    items, image_grids, video_grids, seconds = [], [], [], []
    for _ in range(rng.randint(1, 3)):
        ids += [rng.randint(10, 100) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            grid = (1, 2 * rng.randint(1, 4), 2 * rng.randint(1, 4))
            image_grids.append(grid)
            from mmserve.inputs import MultiModalItem

            n = grid[1] * grid[2] // 4
            items.append(MultiModalItem("img", len(ids), n, {"image_grid_thw": grid}))
            ids += [IMAGE_PAD] * n
            continue
        fps = rng.choice([1.0, 2.0, 3.0, 0.5])
        num = rng.randint(1, 9)
        frames = make_video(seed, num, (rng.choice([56, 84, 140]), rng.choice([56, 112])))
        stamps = tuple(i / fps for i in range(num))
        video = prepare_video(VideoFrames(frames, fps, stamps), "m", settings)
        video_grids.append(video.grid)
        seconds.append(video.second_per_grid_t)
        items += video.items(len(ids))
        ids += [VIDEO_PAD] * video.length
    ids += [rng.randint(10, 100) for _ in range(rng.randint(1, 5))]
    input_ids = torch.tensor([ids])
    types = (input_ids == IMAGE_PAD).int() + 2 * (input_ids == VIDEO_PAD).int()
    kwargs: dict[str, Any] = {"video_grid_thw": torch.tensor(video_grids) if video_grids else None}
    kwargs["image_grid_thw"] = torch.tensor(image_grids) if image_grids else None
    if "2_5" in config.architecture and seconds:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds)
    expected, delta = hf.model.get_rope_index(input_ids, types, **kwargs)
    mine = model.mrope_positions(len(ids), items)
    assert torch.equal(mine.table, expected[:, 0])
    # generated tokens: transformers' generate continues from the last position + 1 (its
    # rope_deltas, max + 1 - n, differ once a video's time positions pass the text's)
    assert mine.delta == int(expected[0, 0, -1]) + 1 - len(ids)
    assert int(delta) >= mine.delta


def test_per_group_encoding_equals_whole_video_encoding(pair):
    config, model, hf = pair
    video = prepare_video(make_video(5, 6, (150, 100)), "m", load_video_settings(config.path))
    with torch.inference_mode():
        whole = hf.model.visual(
            torch.from_numpy(video.pixel_values), grid_thw=torch.tensor([video.grid])
        ).pooler_output
        groups = model.encode_images([item.data for item in video.items(0)])
        (mine,) = model.encode_images(
            [{"pixel_values": video.pixel_values, "image_grid_thw": video.grid}]
        )
    assert whole.shape[0] == video.length
    # transformers' tower on the whole video (cu_seqlens per frame group) vs one group at a
    # time: equal up to float32 summation order, as the vision-tower tests allow
    torch.testing.assert_close(torch.cat(groups), whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(groups), mine, atol=1e-6, rtol=1e-6)


# ---- budgets and limits ----------------------------------------------------------------
def test_budget_unit_is_the_largest_frame_group_not_the_video(tmp_path):
    from mmserve.engine_args import EngineArgs
    from mmserve.multimodal.budget import compute_encoder_budget

    path = resolve_model_path("tiny-qwen2-vl")
    for name in ("config.json", "preprocessor_config.json", "tokenizer.json"):
        (tmp_path / name).write_text((path / name).read_text())
    video = {"size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 400}}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    config = build_model_config(str(tmp_path), max_model_len=4096)
    assert config.max_tokens_per_image == 256  # images: max_pixels 448 * 448
    group = config.max_tokens_per_video_group
    assert 400 <= group < 800  # one frame's worth at the video limits, not a whole video
    sched = EngineArgs(max_num_batched_tokens=2048).scheduler_config()
    items = -(-2048 // group) + 1  # per step: ceil(batch / item) + 1, in frame groups
    assert compute_encoder_budget(config, sched) == (items * group, items * group)
    no_video = EngineArgs(max_num_batched_tokens=2048, limit_mm_per_prompt={"video": 0})
    assert compute_encoder_budget(config, no_video.scheduler_config()) == (9 * 256, 9 * 256)
    with pytest.raises(ValueError, match="largest image or video frame group"):
        compute_encoder_budget(
            config, EngineArgs(max_num_encoder_input_tokens=300).scheduler_config()
        )


def test_limit_mm_per_prompt_takes_video():
    from mmserve.engine_args import EngineArgs

    args = EngineArgs(limit_mm_per_prompt={"image": 1, "video": 3})
    assert args.scheduler_config().max_videos_per_prompt == 3
    assert EngineArgs().scheduler_config().max_videos_per_prompt == 1  # the default
    with pytest.raises(ValueError, match="audio=1"):
        EngineArgs(limit_mm_per_prompt={"audio": 1})


def test_admission_memo_skips_preprocessing_per_tenant():
    videos = video_inputs(build_model_config("tiny-qwen2-vl"))
    frames = make_video(6, 4, (56, 84))
    first = videos.prepare(frames)
    assert videos.prepare(frames.copy()) is first and videos.memo.hits == 1
    other = videos.prepare(frames, cache_salt="tenant")  # no cross-tenant hits (timing)
    assert other is not first and other.mm_hash == first.mm_hash
    smaller = videos.prepare(frames, {"max_pixels": 56 * 56})
    assert smaller.mm_hash != first.mm_hash and smaller.grid != first.grid
