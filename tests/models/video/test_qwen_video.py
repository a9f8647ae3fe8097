"""Qwen2-VL / Qwen2.5-VL video: greedy output of mmserve equals transformers' generate (float32)
fed the same ``pixel_values_videos`` / ``video_grid_thw`` / ``second_per_grid_ts`` and input
ids, under every cache setting; frame groups are encoded once across chat turns; a long video
prefills under an encoder budget of one frame group."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoConfig, AutoTokenizer, Qwen2VLImageProcessorPil

from mmserve import LLM, SamplingParams
from mmserve.inputs import PromptInput, VideoFrames
from mmserve.models.tiny import QWEN_SPECIAL_TOKEN_IDS, resolve_model_path
from mmserve.multimodal.video.prep import video_frames
from mmserve.multimodal.video.qwen2_vl import load_video_settings, preprocess_video
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

MODELS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]
GREEDY = SamplingParams(temperature=0, max_tokens=16)
IMAGE_PAD = QWEN_SPECIAL_TOKEN_IDS["<|image_pad|>"]
VIDEO_PAD = QWEN_SPECIAL_TOKEN_IDS["<|video_pad|>"]
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
GROUP = 24  # embeddings per frame group of the 112x168 test frames (4 x 6 merged patches)
# every engine and the reference: frames of at most 112x168, so the largest possible frame
# group (any aspect ratio) has 69 embeddings and a budget of that many fits two test groups
KWARGS = {"max_pixels": 112 * 168}
FLOOR = 69
ENGINE = {"processor_kwargs": KWARGS}


def make_frames(seed: int, num_frames: int, size: tuple[int, int] = (168, 112)) -> np.ndarray:
    return np.stack([np.asarray(make_image(seed * 100 + i, size)) for i in range(num_frames)])


def prompt(question: str, parts: str = VIDEO) -> str:
    return f"<|im_start|>user\n{parts}{question}<|im_end|>\n<|im_start|>assistant\n"


class VideoReference:
    """transformers' model of the preset fed the same processor outputs as mmserve."""

    def __init__(self, model: str) -> None:
        path = resolve_model_path(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(path, **KWARGS)
        self.settings = load_video_settings(path, KWARGS)
        arch = AutoConfig.from_pretrained(path).architectures[0]
        self.model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float32).eval()
        self.absolute_time = arch.startswith("Qwen2_5")

    def inputs(self, text: str, videos: list[Any], images: list[Image.Image]) -> dict[str, Any]:
        ids = self.tokenizer(text)["input_ids"]
        kwargs: dict[str, Any] = {}
        counts: dict[int, list[int]] = {IMAGE_PAD: [], VIDEO_PAD: []}
        if videos:
            frames = [video_frames(v) for v in videos]
            out = [preprocess_video(f.frames, self.settings) for f in frames]
            grids = torch.tensor([grid for _, grid in out])
            kwargs["pixel_values_videos"] = torch.from_numpy(np.concatenate([p for p, _ in out]))
            kwargs["video_grid_thw"] = grids
            if self.absolute_time:
                kwargs["second_per_grid_ts"] = torch.tensor([2 / f.fps for f in frames])
            counts[VIDEO_PAD] = (grids.prod(-1) // 4).tolist()
        if images:
            out_img = self.images(images=images, return_tensors="pt")
            kwargs["pixel_values"] = out_img["pixel_values"]
            kwargs["image_grid_thw"] = out_img["image_grid_thw"]
            counts[IMAGE_PAD] = (out_img["image_grid_thw"].prod(-1) // 4).tolist()
        iters = {k: iter(v) for k, v in counts.items()}
        ids = [t for i in ids for t in ([i] * next(iters[i]) if i in iters else [i])]
        input_ids = torch.tensor([ids])
        types = (input_ids == IMAGE_PAD).int() + 2 * (input_ids == VIDEO_PAD).int()
        mask = torch.ones_like(input_ids)
        return {"input_ids": input_ids, "attention_mask": mask, "mm_token_type_ids": types} | kwargs

    def greedy(self, text: str, videos: list[Any], images: list[Image.Image] = ()) -> list[int]:
        inputs = self.inputs(text, videos, list(images))
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module", params=MODELS)
def model(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def ref(model) -> VideoReference:
    return VideoReference(model)


@pytest.fixture(scope="module")
def cases(ref) -> list[tuple[dict[str, Any], list[int]]]:
    """Prompts (a video; a video at 1 fps between two images; a PIL-frame video; two videos)
    and transformers' greedy tokens for each."""
    video = make_frames(1, 8)  # 4 groups of 24 embeddings
    slow = VideoFrames(make_frames(2, 5), 1.0, tuple(float(i) for i in range(5)))  # 3 groups
    pil = [Image.fromarray(f) for f in make_frames(3, 4, (84, 56))]
    img = [make_image(7, (140, 84)), make_image(8, (56, 112))]
    specs = [
        (prompt("What happens?"), [video], []),
        (prompt("Compare.", f"{IMAGE}{VIDEO}{IMAGE}"), [slow], img),
        (prompt("Describe the clip."), [pil], []),
        (prompt("Which is longer?", VIDEO + VIDEO), [slow, video], []),
    ]
    out = []
    for text, videos, images in specs:
        request = {"prompt": text, "videos": videos, "images": images}
        out.append((request, ref.greedy(text, videos, images)))
    return out


def check(llm: LLM, ref: Any, cases) -> None:
    """Prompt ids and greedy tokens equal the reference's (any family's video reference)."""
    outs = llm.generate([c for c, _ in cases], GREEDY, use_tqdm=False)
    for (case, expected), out in zip(cases, outs, strict=True):
        ids = ref.inputs(case["prompt"], case["videos"], case["images"])["input_ids"]
        assert out.prompt_token_ids == ids[0].tolist()
        assert out.outputs[0].token_ids == expected, case["prompt"]
    assert_no_leaks(llm)


SETTINGS = {
    "default": {},
    "no-encoder-cache": {"enable_encoder_cache": False},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "chunks-16": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
    "unsplit-groups": {"disable_chunked_mm_input": True, "max_num_batched_tokens": 72},
    "small-encoder": {"max_num_encoder_input_tokens": FLOOR, "encoder_cache_size": 2 * FLOOR},
    "preemption": {"num_kv_blocks": 16, "block_size": 16, "max_model_len": 256},
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_parity_under_cache_settings(model, ref, cases, setting):
    limits = {"image": 2, "video": 2}
    llm = LLM(model, seed=0, limit_mm_per_prompt=limits, **SETTINGS[setting], **ENGINE)
    assert llm.engine.config.model.max_tokens_per_video_group == FLOOR
    check(llm, ref, cases)
    metrics = llm.get_metrics()
    if setting == "preemption":
        assert metrics["num_preemptions"] > 0
    if setting == "default":  # the 8-frame video is in two prompts: its 4 groups encode once
        assert metrics["encoder_images_encoded"] == 4 + 3 + 2 + 2


def test_second_turn_encodes_no_frame_group(model, ref):
    llm = LLM(model, seed=0, **ENGINE)
    video = make_frames(4, 12)  # 6 frame groups
    text1 = prompt("What happens?")
    out1 = llm.generate({"prompt": text1, "videos": [video]}, GREEDY, use_tqdm=False)[0]
    assert llm.get_metrics()["encoder_images_encoded"] == 6
    text2 = text1 + out1.outputs[0].text + "<|im_end|>\n" + prompt("And then?", "")
    out2 = llm.generate({"prompt": text2, "videos": [video]}, GREEDY, use_tqdm=False)[0]
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 6, metrics  # turn 2 encoded nothing
    assert metrics["prefix_cache_hits"] > 0
    assert out1.outputs[0].token_ids == ref.greedy(text1, [video])
    assert out2.outputs[0].token_ids == ref.greedy(text2, [video])
    assert_no_leaks(llm)


def test_long_video_prefills_under_one_group_budget(model, ref):
    frames = make_frames(5, 64)  # 32 groups of 24 embeddings
    llm = LLM(
        model,
        seed=0,
        max_num_encoder_input_tokens=FLOOR,  # at most two of these groups per step
        encoder_cache_size=FLOOR,
        max_num_batched_tokens=32,
        enable_encoder_cache=False,
        **ENGINE,
    )
    text = prompt("Summarize the video.")
    out = llm.generate({"prompt": text, "videos": [frames]}, GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids.count(VIDEO_PAD) == 32 * GROUP
    assert out.outputs[0].token_ids == ref.greedy(text, [frames])
    assert llm.get_metrics()["encoder_images_encoded"] == 32
    assert_no_leaks(llm)


def test_bad_video_requests_fail_alone(model):
    llm = LLM(model, seed=0, max_model_len=128, **ENGINE)
    with pytest.raises(ValueError, match="1 video placeholder"):
        llm.generate({"prompt": prompt("?"), "videos": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="could not read local video a.mp4"):  # no such file
        llm.generate({"prompt": prompt("?"), "videos": ["a.mp4"]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        request = {"prompt": prompt("?"), "videos": [make_frames(6, 16)]}  # 8 x 24 tokens
        llm.generate(request, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="limit of 0"):
        LLM(model, limit_mm_per_prompt={"video": 0}, **ENGINE).generate(
            {"prompt": prompt("?"), "videos": [make_frames(6, 2)]}, GREEDY, use_tqdm=False
        )
    out = llm.generate({"prompt": prompt("?"), "videos": [make_frames(6, 2)]}, GREEDY, False)
    assert out[0].outputs[0].token_ids


def test_async_engine_admits_decoded_videos(model, ref):
    """The server's path: ``AsyncLLMEngine.generate`` of a ``PromptInput`` with videos
    preprocesses in the media threads and gives transformers' tokens; a bad video is a
    ValueError, the engine serves on."""
    import asyncio

    from mmserve.engine.front.async_engine import AsyncLLMEngine
    from mmserve.engine.loop.llm_engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine.from_args(model, seed=0, **ENGINE))
    video = VideoFrames(make_frames(8, 6), 3.0, tuple(i / 3 for i in range(6)))
    text = prompt("What moves?")

    async def run(videos: list[Any]) -> list[int]:
        outs = [o async for o in engine.generate(PromptInput(text, videos=videos), params=GREEDY)]
        return outs[-1].outputs[0].token_ids

    try:
        with pytest.raises(ValueError, match="could not decode the video"):
            asyncio.run(run([b"not a video"]))
        assert asyncio.run(run([video])) == ref.greedy(text, [video])
    finally:
        engine.shutdown()
