"""Qwen3-VL video: greedy output of mmserve equals transformers' ``generate`` (float32) fed the
same ``pixel_values_videos`` / ``video_grid_thw`` and the input ids of transformers' own
timestamp expansion (``Qwen3VLProcessor.replace_video_token`` over the frames its video
processor samples), under every cache setting; a chat's second turn encodes no frame group."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoTokenizer,
    Qwen2VLImageProcessorPil,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata

from mmserve import LLM
from mmserve.inputs import PromptInput, VideoFrames
from mmserve.models.tiny import QWEN_SPECIAL_TOKEN_IDS, resolve_model_path
from mmserve.multimodal.video.prep import video_frames
from mmserve.multimodal.video.qwen2_vl import preprocess_video
from mmserve.multimodal.video.qwen3 import load_qwen3_video_settings
from tests.models.video.test_qwen_video import GREEDY, IMAGE, VIDEO, check, make_frames, prompt
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

MODEL = "tiny-qwen3-vl"
IMAGE_PAD = QWEN_SPECIAL_TOKEN_IDS["<|image_pad|>"]
VIDEO_PAD = QWEN_SPECIAL_TOKEN_IDS["<|video_pad|>"]
GROUP_MAX = 160  # embeddings of the largest frame group (two frames of <= 131072 pixels each)
BUDGET = 256  # the largest image: the smallest encoder budget the engine accepts


class Qwen3VideoReference:
    """transformers' Qwen3-VL fed mmserve's pixels and transformers' own prompt expansion."""

    def __init__(self) -> None:
        path = resolve_model_path(MODEL)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(path)
        self.video_processor = Qwen3VLVideoProcessor.from_pretrained(path)
        self.settings = load_qwen3_video_settings(path)
        self.model = Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        self.model.eval()
        # the processor's class needs torchvision to load; its expansion method does not
        self.processor = SimpleNamespace(
            video_processor=self.video_processor,
            vision_start_token="<|vision_start|>",
            vision_end_token="<|vision_end|>",
            video_token="<|video_pad|>",
        )
        self.processor._calculate_timestamps = partial(
            Qwen3VLProcessor._calculate_timestamps, self.processor
        )

    def video(
        self, video: Any, sampling: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, tuple[int, int, int], str]:
        """Pixels, grid and placeholder text of one video, sampled by transformers (with
        ``sampling``: its ``fps`` / ``num_frames`` arguments)."""
        frames = video_frames(video)
        total = len(frames.frames)
        metadata = VideoMetadata(total_num_frames=total, fps=frames.fps)
        metadata.frames_indices = self.video_processor.sample_frames(metadata, **(sampling or {}))
        pixels, grid = preprocess_video(frames.frames[metadata.frames_indices], self.settings)
        inputs = {"video_grid_thw": torch.tensor([grid]), "video_metadata": [metadata]}
        text = Qwen3VLProcessor.replace_video_token(self.processor, inputs, 0)
        return pixels, grid, text

    def inputs(
        self,
        text: str,
        videos: list[Any],
        images: list[Image.Image],
        sampling: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if videos:
            out = [self.video(v, sampling) for v in videos]
            kwargs["pixel_values_videos"] = torch.from_numpy(np.concatenate([p for p, _, _ in out]))
            kwargs["video_grid_thw"] = torch.tensor([g for _, g, _ in out])
            parts = text.split("<|video_pad|>")
            pairs = zip(out, parts[1:], strict=True)
            text = parts[0] + "".join(r + part for (_, _, r), part in pairs)
        ids = self.tokenizer(text)["input_ids"]
        if images:
            out_img = self.images(images=images, return_tensors="pt")
            kwargs["pixel_values"] = out_img["pixel_values"]
            kwargs["image_grid_thw"] = out_img["image_grid_thw"]
            counts = iter((out_img["image_grid_thw"].prod(-1) // 4).tolist())
            ids = [t for i in ids for t in ([i] * next(counts) if i == IMAGE_PAD else [i])]
        input_ids = torch.tensor([ids])
        types = (input_ids == IMAGE_PAD).int() + 2 * (input_ids == VIDEO_PAD).int()
        mask = torch.ones_like(input_ids)
        return {"input_ids": input_ids, "attention_mask": mask, "mm_token_type_ids": types} | kwargs

    def greedy(
        self,
        text: str,
        videos: list[Any],
        images: list[Image.Image] = (),
        sampling: dict[str, Any] | None = None,
    ) -> list[int]:
        inputs = self.inputs(text, videos, list(images), sampling)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def ref() -> Qwen3VideoReference:
    return Qwen3VideoReference()


@pytest.fixture(scope="module")
def cases(ref) -> list[tuple[dict[str, Any], list[int]]]:
    """A video (2 groups of 64 embeddings); a 3 fps video that the processor samples down to
    4 of its 6 frames (2 groups of 20) between two images (more than the small encoder
    budget together); transformers' tokens for each."""
    video = make_frames(1, 4, (256, 256))
    fast = VideoFrames(make_frames(2, 6), 3.0, tuple(i / 3 for i in range(6)))
    img = [make_image(7, (320, 240)), make_image(8, (56, 112))]  # 80 + 8 embeddings
    specs = [
        (prompt("What happens?"), [video], []),
        (prompt("Compare.", f"{IMAGE}{VIDEO}{IMAGE}"), [fast], img),
    ]
    return [
        ({"prompt": text, "videos": videos, "images": images}, ref.greedy(text, videos, images))
        for text, videos, images in specs
    ]


SETTINGS = {
    "default": {},
    "no-encoder-cache": {"enable_encoder_cache": False},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "chunks-16": {"max_num_batched_tokens": 16, "max_num_seqs": 4},
    "small-encoder": {"max_num_encoder_input_tokens": BUDGET, "encoder_cache_size": BUDGET},
    "preemption": {
        "num_kv_blocks": 16,
        "block_size": 16,
        "max_model_len": 256,
        "max_num_batched_tokens": 32,
    },
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_parity_under_cache_settings(ref, cases, setting):
    llm = LLM(MODEL, seed=0, limit_mm_per_prompt={"image": 2, "video": 1}, **SETTINGS[setting])
    assert llm.engine.config.model.max_tokens_per_video_group == GROUP_MAX
    check(llm, ref, cases)
    metrics = llm.get_metrics()
    if setting == "preemption":
        assert metrics["num_preemptions"] > 0
    if setting == "default":
        assert metrics["encoder_images_encoded"] == 2 + (2 + 2)


def test_timestamps_and_group_ranges(ref):
    """Each group is its own item, placed on its run of video tokens after its timestamp."""
    llm = LLM(MODEL, seed=0)
    video = VideoFrames(make_frames(3, 5), 1.0, tuple(float(i) for i in range(5)))  # 3 groups
    processed = llm.engine.processor.process(PromptInput(prompt("?"), videos=[video]))
    text = ref.tokenizer.decode(processed.prompt_token_ids)
    assert "<0.5 seconds>" in text and "<2.5 seconds>" in text and "<4.0 seconds>" in text
    ids = np.asarray(processed.prompt_token_ids)
    for item in processed.mm_items:
        assert (ids[item.offset : item.offset + item.length] == VIDEO_PAD).all()
        assert ids[item.offset - 1] == QWEN_SPECIAL_TOKEN_IDS["<|vision_start|>"]
        assert ids[item.offset + item.length] == QWEN_SPECIAL_TOKEN_IDS["<|vision_end|>"]
    assert [i.video.index for i in processed.mm_items] == [0, 1, 2]
    assert (
        processed.prompt_token_ids == ref.inputs(prompt("?"), [video], [])["input_ids"][0].tolist()
    )
    with pytest.raises(ValueError, match="temporal_factor"):  # transformers refuses it too
        llm.generate({"prompt": prompt("?"), "videos": [make_frames(3, 1)]}, GREEDY, False)
    assert llm.generate({"prompt": prompt("?"), "videos": [make_frames(3, 2)]}, GREEDY, False)


def test_second_turn_encodes_no_frame_group(ref):
    llm = LLM(MODEL, seed=0)
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


def test_group_bound_holds_for_every_shape():
    """``max_tokens_per_video_group`` bounds (and is reached by) the groups of videos of any
    frame count and shape, elongated ones included."""
    settings = load_qwen3_video_settings(resolve_model_path(MODEL))
    largest = 0
    for num in (2, 3, 5, 9):
        for h in [*range(1, 64), *range(64, 1400, 23)]:
            for w in range(h, min(200 * h, 7000), max(1, h // 2)):
                _, gh, gw = settings.grid(num, h, w)
                largest = max(largest, gh * gw // 4)
    _, gh, gw = settings.grid(2, 1, 200)  # two frames of the most elongated shape
    assert largest <= GROUP_MAX == gh * gw // 4


def test_encoded_video_is_sampled_as_transformers_samples(ref):
    """Bytes decode to the frames ``Qwen3VLVideoProcessor.sample_frames`` keeps (not the
    Qwen2-VL rule's), then parity with transformers fed every decoded frame."""
    from mmserve.multimodal.video.decode import decode_video
    from mmserve.multimodal.video.qwen3 import Qwen3VideoSampling
    from mmserve.multimodal.video.sampling import VideoSampling
    from tests.support.video import make_video

    data = make_video(12, 6, (128, 96))  # 2 s at 6 fps: 4 frames at 2 fps
    assert Qwen3VideoSampling().indices(12, 6.0) == [0, 4, 7, 11]
    assert VideoSampling().indices(12, 6.0) == [0, 3, 6, 9]
    every = decode_video(data, VideoSampling(fps=None, num_frames=12))
    assert len(every.frames) == 12 and every.fps == 6.0
    llm = LLM(MODEL, seed=0)
    text = prompt("What happens?")
    out = llm.generate({"prompt": text, "videos": [data]}, GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == ref.inputs(text, [every], [])["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == ref.greedy(text, [every])
    assert_no_leaks(llm)


@pytest.mark.parametrize("encoded", [True, False], ids=["bytes", "frames"])
@pytest.mark.parametrize("sampling", [{"fps": 4.0}, {"num_frames": 10}], ids=["fps", "num"])
def test_engine_sampling_above_the_checkpoint_is_applied_once(ref, sampling, encoded):
    """``--mm-processor-kwargs`` asking for more frames than the checkpoint's 2 fps: the model
    sees the frames sampled once with them (8 or 10 of 12, not 4), as transformers' video
    processor samples every frame with the same ``fps`` / ``num_frames``; bytes (sampled by
    the decoder) and frames given decoded alike."""
    from mmserve.multimodal.video.decode import decode_video
    from mmserve.multimodal.video.sampling import VideoSampling
    from tests.support.video import make_video

    data = make_video(12, 6, (128, 96))  # 2 s at 6 fps
    every = decode_video(data, VideoSampling(fps=None, num_frames=12))
    llm = LLM(MODEL, seed=0, processor_kwargs=sampling)
    text = prompt("What happens?")
    out = llm.generate({"prompt": text, "videos": [data if encoded else every]}, GREEDY, False)[0]
    expected = ref.inputs(text, [every], [], sampling)["input_ids"][0].tolist()
    start = QWEN_SPECIAL_TOKEN_IDS["<|vision_start|>"]
    assert expected.count(start) == 1 + (8 if "fps" in sampling else 10) // 2  # frame groups
    assert out.prompt_token_ids == expected
    assert out.outputs[0].token_ids == ref.greedy(text, [every], sampling=sampling)
    assert_no_leaks(llm)


@pytest.mark.parametrize("encoded", [True, False], ids=["bytes", "frames"])
def test_request_sampling_is_applied_once(ref, encoded):
    """A request's ``mm_processor_kwargs`` ``fps`` / ``num_frames`` (as Qwen2-VL's take them)
    pick the frames once, as transformers' video processor samples every frame with the same
    arguments; the next request without them gets the checkpoint's 2 fps again."""
    from mmserve.multimodal.video.decode import decode_video
    from mmserve.multimodal.video.sampling import VideoSampling
    from tests.support.video import make_video

    data = make_video(12, 6, (128, 96))  # 2 s at 6 fps
    every = decode_video(data, VideoSampling(fps=None, num_frames=12))
    llm = LLM(MODEL, seed=0)
    text = prompt("What happens?")
    start = QWEN_SPECIAL_TOKEN_IDS["<|vision_start|>"]
    for sampling, groups in (({"fps": 4.0}, 4), ({"num_frames": 10}, 5), (None, 2)):
        request = {"prompt": text, "videos": [data if encoded else every]}
        out = llm.generate({**request, "mm_processor_kwargs": sampling}, GREEDY, False)[0]
        expected = ref.inputs(text, [every], [], sampling)["input_ids"][0].tolist()
        assert expected.count(start) == 1 + groups  # 8, 10 or 4 of the 12 frames
        assert out.prompt_token_ids == expected
        assert out.outputs[0].token_ids == ref.greedy(text, [every], sampling=sampling)
    assert_no_leaks(llm)
