"""LLaVA-OneVision video: greedy output of mmserve equals transformers' generate (float32) fed
the same ``pixel_values_videos`` and input ids, for a video and an image + video prompt under
every cache setting; frames are encoded one item each and once across chat turns; the
placeholder count, budget and preprocessing settings."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LlavaOnevisionForConditionalGeneration as HFOnevision
from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

from mmserve import LLM, SamplingParams
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput, VideoFrames
from mmserve.models.llava_onevision import pool_frames
from mmserve.models.tiny import resolve_model_path
from mmserve.models.tiny.families.llava_onevision import IDS, load_onevision_processor
from mmserve.multimodal.video.onevision import (
    load_onevision_video_settings,
    preprocess_onevision_video,
)
from mmserve.multimodal.video.prep import video_frames
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image
from tests.support.video import make_video

MODEL = "tiny-llava-onevision"
GREEDY = SamplingParams(temperature=0, max_tokens=16)
VIDEO_TOKEN = IDS["<video>"]
FRAME = 4  # 32x32 frames of 8x8 patches: a 4x4 grid pooled to 2x2
LIMITS = {"image": 1, "video": 1}


def make_frames(seed: int, num_frames: int, size: tuple[int, int] = (48, 40)) -> np.ndarray:
    return np.stack([np.asarray(make_image(seed * 100 + i, size)) for i in range(num_frames)])


def prompt(question: str, parts: str = "<video>") -> str:
    return f"<|im_start|>user {parts}\n{question}<|im_end|><|im_start|>assistant\n"


class VideoReference:
    """transformers' model of the preset fed the same processor outputs as mmserve."""

    def __init__(self) -> None:
        path = resolve_model_path(MODEL)
        self.processor = load_onevision_processor(path)
        self.video_token = self.processor.video_token
        self.processor.video_token = None  # expands images only; videos are expanded here
        self.model = HFOnevision.from_pretrained(path, dtype=torch.float32).eval()
        self.settings = load_onevision_video_settings(path, self.model.config)

    def inputs(self, text: str, video: Any, images: list[Image.Image]) -> dict[str, Any]:
        """``images``: one sample's (a chat's), so several take the multi-image mode."""
        sample = [images] if images else None
        out = dict(self.processor(text=text, images=sample, return_tensors="pt"))
        frames = video_frames(video).frames
        ids = out["input_ids"][0].tolist()
        at = ids.index(VIDEO_TOKEN)
        ids[at : at + 1] = [VIDEO_TOKEN] * self.settings.tokens(len(frames))
        out["input_ids"] = torch.tensor([ids])
        out["attention_mask"] = torch.ones_like(out["input_ids"])
        pixels = preprocess_onevision_video(frames, self.settings)
        out["pixel_values_videos"] = torch.from_numpy(pixels)[None]
        return out

    def greedy(self, text: str, video: Any, images: list[Image.Image] = ()) -> list[int]:
        inputs = self.inputs(text, video, list(images))
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def ref() -> VideoReference:
    return VideoReference()


@pytest.fixture(scope="module")
def cases(ref) -> list[tuple[dict[str, Any], list[int]]]:
    """A video (resized frames); an image + a PIL-frame video at 1 fps; and transformers'
    greedy tokens for each."""
    video = make_frames(1, 6)
    slow = VideoFrames([Image.fromarray(f) for f in make_frames(2, 3, (32, 32))], 1.0, (0, 1, 2))
    image = make_image(7, (96, 80))
    specs = [
        (prompt("What happens?"), video, []),
        (prompt("Compare.", "<image><video>"), slow, [image]),
    ]
    return [({"prompt": t, "videos": [v], "images": i}, ref.greedy(t, v, i)) for t, v, i in specs]


SETTINGS = {
    "default": {},
    "no-encoder-cache": {"enable_encoder_cache": False},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "no-caches": {"enable_encoder_cache": False, "enable_prefix_caching": False},
    "chunks-8": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
    "unsplit-items": {"disable_chunked_mm_input": True, "max_num_batched_tokens": 112},
    "small-encoder": {"max_num_encoder_input_tokens": 100, "encoder_cache_size": 200},
    "preemption": {"num_kv_blocks": 10, "block_size": 16, "max_model_len": 128},
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_parity_under_cache_settings(ref, cases, setting):
    llm = LLM(MODEL, seed=0, limit_mm_per_prompt=LIMITS, **SETTINGS[setting])
    assert llm.engine.config.model.max_tokens_per_video_group == FRAME + 1
    outs = llm.generate([c for c, _ in cases] * 2, GREEDY, use_tqdm=False)
    for (case, expected), out in zip(cases * 2, outs, strict=True):
        ids = ref.inputs(case["prompt"], case["videos"][0], case["images"])["input_ids"]
        assert out.prompt_token_ids == ids[0].tolist()
        assert out.outputs[0].token_ids == expected, (setting, case["prompt"])
    assert_no_leaks(llm)
    metrics = llm.get_metrics()
    if setting == "preemption":
        assert metrics["num_preemptions"] > 0
    if setting == "default":  # each prompt twice: 6 + 3 frames and 1 image encode once
        assert metrics["encoder_images_encoded"] == 6 + 3 + 1


def test_second_turn_encodes_nothing_for_the_video(ref):
    llm = LLM(MODEL, seed=0)
    video = make_frames(4, 8)
    text1 = prompt("What happens?")
    out1 = llm.generate({"prompt": text1, "videos": [video]}, GREEDY, use_tqdm=False)[0]
    assert llm.get_metrics()["encoder_images_encoded"] == 8  # one item per frame
    text2 = text1 + out1.outputs[0].text + "<|im_end|>" + prompt("And then?", "")
    out2 = llm.generate({"prompt": text2, "videos": [video]}, GREEDY, use_tqdm=False)[0]
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 8, metrics  # turn 2 encoded nothing
    assert metrics["prefix_cache_hits"] > 0
    assert out1.outputs[0].token_ids == ref.greedy(text1, video)
    assert out2.outputs[0].token_ids == ref.greedy(text2, video)
    assert_no_leaks(llm)


def test_long_video_prefills_under_one_frame_budget(ref):
    frames = make_frames(5, 40)
    llm = LLM(
        MODEL,
        seed=0,
        limit_mm_per_prompt={"image": 0, "video": 1},  # the largest item: the last frame
        max_num_encoder_input_tokens=FRAME + 1,
        encoder_cache_size=FRAME + 1,
        max_num_batched_tokens=8,
        enable_encoder_cache=False,
    )
    text = prompt("Summarize the video.")
    out = llm.generate({"prompt": text, "videos": [frames]}, GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids.count(VIDEO_TOKEN) == 40 * FRAME + 1
    assert out.outputs[0].token_ids == ref.greedy(text, frames)
    assert llm.get_metrics()["encoder_images_encoded"] == 40
    assert_no_leaks(llm)


def test_placeholders_and_settings_follow_transformers(ref):
    processor, config = ref.processor, ref.model.config
    pooled = math.ceil(math.isqrt(processor.num_image_tokens) / 2) ** 2
    assert pooled == FRAME
    processor.video_token = ref.video_token
    try:
        text = processor.replace_video_token({"pixel_values_videos": [np.zeros((5, 3, 32, 32))]}, 0)
    finally:
        processor.video_token = None
    assert text == "<video>" * ref.settings.tokens(5)
    image_settings = processor.image_processor
    assert ref.settings.mean == tuple(image_settings.image_mean)
    assert (ref.settings.height, ref.settings.width) == (config.vision_config.image_size,) * 2
    frames = make_frames(6, 2, (32, 32))  # already the crop size: rescale + normalize only
    expected = frames.transpose(0, 3, 1, 2) / 255.0 - np.reshape(ref.settings.mean, (3, 1, 1))
    expected /= np.reshape(ref.settings.std, (3, 1, 1))
    np.testing.assert_allclose(
        preprocess_onevision_video(frames, ref.settings), expected, atol=1e-5
    )


def test_bad_video_requests_fail_alone():
    llm = LLM(MODEL, seed=0, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt": prompt("?"), "videos": [make_frames(6, 16)]}, GREEDY, False)
    with pytest.raises(ValueError, match="1 video placeholder"):
        llm.generate({"prompt": prompt("?"), "videos": []}, GREEDY, use_tqdm=False)
    out = llm.generate({"prompt": prompt("?"), "videos": [make_frames(6, 2)]}, GREEDY, False)
    assert out[0].outputs[0].token_ids
    assert_no_leaks(llm)


@pytest.mark.parametrize("side", [4, 7, 27])  # 27: the released 384 / 14 towers (odd grid)
def test_frame_pooling_matches_transformers(side):
    vision = SimpleNamespace(image_size=side * 14, patch_size=14)
    owner = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    feats = torch.randn(3, side * side, 16, generator=torch.Generator().manual_seed(side))
    expected = LlavaOnevisionModel.apply_pooling(owner, feats).reshape(-1, 16)  # type: ignore[arg-type]
    assert torch.equal(pool_frames(feats), expected)
    assert len(expected) == 3 * math.ceil(side / 2) ** 2


def test_settings_files_in_transformers_order(ref, tmp_path):
    """``video_preprocessor_config.json`` over ``preprocessor_config.json`` over the class
    defaults; frames the tower cannot take are refused by name."""
    config = ref.model.config
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"size": {"height": 32, "width": 32}, "image_mean": [0.5] * 3})
    )
    assert load_onevision_video_settings(tmp_path, config).mean == (0.5,) * 3
    video = {"size": {"height": 32, "width": 32}, "image_mean": [0.25] * 3, "resample": 2}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    settings = load_onevision_video_settings(tmp_path, config)
    assert (settings.mean, settings.resample, settings.tokens(3)) == ((0.25,) * 3, "bilinear", 13)
    video["size"] = {"height": 384, "width": 384}  # the class default
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    with pytest.raises(ValueError, match="takes 32x32 frames"):
        load_onevision_video_settings(tmp_path, config)


def test_encoded_video_is_decoded_sampled_and_matches(ref):
    """Video bytes (3 s at 30 fps) are decoded and sampled at 2 fps, then served as frames."""
    llm = LLM(MODEL, seed=0)
    data = make_video(90, 30)
    frames = llm.engine.processor.videos.load(data)
    assert len(frames.frames) == 6
    text = prompt("What happens?")
    out = llm.generate({"prompt": text, "videos": [data]}, GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids.count(VIDEO_TOKEN) == 6 * FRAME + 1
    assert out.outputs[0].token_ids == ref.greedy(text, frames)
    assert_no_leaks(llm)


def test_async_engine_admits_onevision_videos(ref):
    """The server's path: admission prepares the video in the media threads."""
    engine = AsyncLLMEngine(LLMEngine.from_args(MODEL, seed=0))
    video = make_frames(8, 5)
    text = prompt("What moves?")

    async def run() -> list[int]:
        outs = [o async for o in engine.generate(PromptInput(text, videos=[video]), params=GREEDY)]
        return outs[-1].outputs[0].token_ids

    try:
        assert asyncio.run(run()) == ref.greedy(text, video)
    finally:
        engine.shutdown()
