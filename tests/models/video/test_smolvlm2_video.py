"""SmolVLM2 video: prompt ids equal ``SmolVLMProcessor.apply_chat_template(..., tokenize=True)``
on a video file (its sampling, timestamps and text), greedy output token-identical to
transformers' ``SmolVLMForConditionalGeneration`` (float32) fed that processor's inputs, under
several cache settings; one encoder-cache entry per video and sampling; SmolVLM (v1) refuses
videos; a served video chat answers as the offline API.

transformers' video processor resizes with torchvision, absent here: the reference processor
is transformers' own (decoding, ``sample_frames``, metadata, prompt text) with only the pixel
math (``_preprocess``) taken from mmserve; ``test_pixels_match_torchvision`` checks that math
against the real one where torchvision is installed.
"""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoImageProcessor, AutoTokenizer, SmolVLMForConditionalGeneration
from transformers.image_processing_utils import BatchFeature
from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor
from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor
from transformers.video_utils import load_video

from mmserve import LLM, SamplingParams
from mmserve.models.tiny import resolve_model_path
from mmserve.multimodal.video.smolvlm import (
    load_smolvlm_video_settings,
    preprocess_smolvlm_video,
    smolvlm_indices,
)
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image
from tests.support.video import make_video
from tests.support.video_chat import offline_answer, served_answer

MODEL = "tiny-smolvlm2-hub"  # video_sampling: fps 1, max_frames 64; 64-pixel tiles of 16
GREEDY = SamplingParams(temperature=0, max_tokens=12)
QUESTION = "What happens in the video?"


def settings(path: Path) -> Any:
    config = SimpleNamespace(vision_config=SimpleNamespace(image_size=64))
    return load_smolvlm_video_settings(path, config, 16)


class MmservePixels(SmolVLMVideoProcessor):
    """transformers' SmolVLM video processor but for its pixel math (torchvision's), decoding
    with transformers' PyAV reader (its default, torchcodec, is absent too)."""

    def fetch_videos(self, url: Any, sample_indices_fn: Any = None) -> Any:
        if isinstance(url, list):
            return list(zip(*[self.fetch_videos(u, sample_indices_fn) for u in url], strict=True))
        return load_video(url, backend="pyav", sample_indices_fn=sample_indices_fn)

    def convert_to_rgb(self, video: torch.Tensor) -> torch.Tensor:
        assert video.shape[-3] == 3  # PyAV's frames are RGB already: torchvision's no-op
        return video

    def _preprocess(self, videos: list[torch.Tensor], **kwargs: Any) -> BatchFeature:
        conf = settings(Path(self.mmserve_path))
        frames = [v.permute(0, 2, 3, 1).numpy() for v in videos]
        pixels = [torch.from_numpy(preprocess_smolvlm_video(f, conf)) for f in frames]
        values = torch.stack(pixels)  # one video: padding changes nothing
        mask = torch.ones_like(values[:, :, 0], dtype=torch.int64)
        data = {"pixel_values": values, "pixel_attention_mask": mask}
        return BatchFeature(data, kwargs["return_tensors"])


class Processor(SmolVLMProcessor):
    """``SmolVLMProcessor``, taking ``MmservePixels`` (transformers' class check looks its video
    processor's base class up by name, which needs torchvision)."""

    def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor":
            return type(argument)
        return super().check_argument_for_proper_class(argument_name, argument)


class Reference:
    """transformers' SmolVLM2 model and ``SmolVLMProcessor`` on the preset's files."""

    def __init__(self) -> None:
        self.path = resolve_model_path(MODEL)
        video_processor = MmservePixels.from_pretrained(self.path)
        video_processor.mmserve_path = str(self.path)
        self.processor = Processor(
            AutoImageProcessor.from_pretrained(self.path),
            AutoTokenizer.from_pretrained(self.path),
            video_processor,
            image_seq_len=16,
        )
        self.model = SmolVLMForConditionalGeneration.from_pretrained(
            self.path, dtype=torch.float32
        ).eval()

    def inputs(self, messages: list[dict], **processor_kwargs: Any) -> dict[str, Any]:
        return dict(
            self.processor.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
                processor_kwargs=processor_kwargs or None,
            )
        )

    def greedy(self, inputs: dict[str, Any]) -> list[int]:
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=GREEDY.max_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def ref() -> Reference:
    return Reference()


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    """Short (12 frames at 6 fps: 2 sampled), 3.5 s (3 at 1 fps, odd rate), long enough to
    skip a second at each end when capped at 2 frames (36 at 6 fps)."""
    root = tmp_path_factory.mktemp("videos")
    out = {}
    for name, (count, fps) in {"short": (12, 6), "odd": (35, 10), "long": (36, 6)}.items():
        out[name] = root / f"{name}.mp4"
        out[name].write_bytes(make_video(count, fps))
    return out


def hf_messages(video: Path, image: Any = None) -> list[dict]:
    content: list[dict] = [{"type": "image", "image": image}] if image is not None else []
    content += [{"type": "video", "path": str(video)}, {"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": content}]


def our_messages(video: Path, image: Any = None) -> list[dict]:
    url = "data:video/mp4;base64," + base64.b64encode(video.read_bytes()).decode()
    content: list[dict] = [{"type": "image", "image": image}] if image is not None else []
    content += [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": QUESTION},
    ]
    return [{"role": "user", "content": content}]


CASES = {  # name -> (video, with an image, mm_processor_kwargs)
    "short": ("short", False, {}),
    "odd-rate": ("odd", False, {}),
    "skip-ends": ("long", False, {"num_frames": 2}),
    "image-and-video": ("short", True, {}),
}


@pytest.fixture(scope="module")
def expected(ref, videos) -> dict[str, tuple[list[int], list[int] | None]]:
    """Per case: (transformers' prompt ids, its greedy tokens; None for an image and a video
    in one prompt, which its processor cannot feed its model: both are ``pixel_values``, the
    video's replace the image's)."""
    out = {}
    for name, (video, with_image, kwargs) in CASES.items():
        image = make_image(3, (120, 50)) if with_image else None
        inputs = ref.inputs(hf_messages(videos[video], image), **kwargs)
        out[name] = (inputs["input_ids"][0].tolist(), None if with_image else ref.greedy(inputs))
    return out


class _Meta(dict):
    """``VideoMetadata`` as ``sample_frames`` reads it (attributes and items)."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


def test_sampling_is_transformers(ref):
    proc = ref.processor.video_processor
    for total, rate, cap in [(12, 6, 64), (35, 10, 64), (36, 6, 2), (300, 30, 4), (7, 2.5, 64)]:
        meta = _Meta(total_num_frames=total, fps=rate, duration=total / rate)
        want = SmolVLMVideoProcessor.sample_frames(proc, meta, num_frames=cap, fps=1).tolist()
        assert smolvlm_indices(total, rate, 1, cap) == want, (total, rate, cap)


SETTINGS = {
    "default": {},
    "no-encoder-cache": {"enable_encoder_cache": False},
    "chunks-8": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_chat_matches_transformers(videos, expected, setting):
    llm = LLM(MODEL, seed=0, limit_mm_per_prompt={"image": 1, "video": 1}, **SETTINGS[setting])
    for name, (video, with_image, kwargs) in CASES.items():
        image = make_image(3, (120, 50)) if with_image else None
        out = llm.chat(
            our_messages(videos[video], image),
            GREEDY,
            use_tqdm=False,
            mm_processor_kwargs=kwargs or None,
        )[0]
        ids, tokens = expected[name]
        assert out.prompt_token_ids == ids, (setting, name)
        assert tokens is None or out.outputs[0].token_ids == tokens, (setting, name)
    assert_no_leaks(llm)


def test_text_prompt_and_one_cache_entry_per_video(ref, videos, expected):
    llm = LLM(MODEL, seed=0)
    text = ref.processor.apply_chat_template(
        hf_messages(videos["short"]), add_generation_prompt=True
    )
    assert text.count("<video>") == 1
    video = videos["short"].read_bytes()
    for _ in range(2):
        out = llm.generate({"prompt": text, "videos": [video]}, GREEDY, use_tqdm=False)[0]
        assert out.prompt_token_ids == expected["short"][0]
        assert out.outputs[0].token_ids == expected["short"][1]
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 1, metrics  # the repeat hit the cache
    resampled = {"prompt": text, "videos": [video], "mm_processor_kwargs": {"num_frames": 1}}
    out = llm.generate(resampled, GREEDY, use_tqdm=False)[0]
    assert "one frames" in llm.get_tokenizer().decode(out.prompt_token_ids)
    assert llm.get_metrics()["encoder_images_encoded"] == 2  # another sampling: another entry
    assert_no_leaks(llm)


def test_smolvlm_v1_refuses_videos(videos):
    llm = LLM("tiny-smolvlm", seed=0)
    assert llm.engine.config.model.max_tokens_per_video_group == 0
    prompt = "<|im_start|>User: <video>What?<end_of_utterance>\nAssistant:"
    with pytest.raises(ValueError, match="this model does not accept videos"):
        llm.generate({"prompt": prompt, "videos": [videos["short"].read_bytes()]}, GREEDY, False)


def test_bad_video_prompts():
    llm = LLM(MODEL, seed=0, max_model_len=64)
    frames = np.zeros((4, 32, 32, 3), np.uint8)
    prompt = "<|im_start|>User: <video>What?<end_of_utterance>\nAssistant:"
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt": prompt, "videos": [frames]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="1 video placeholder"):
        llm.generate({"prompt": prompt, "videos": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="min_frames"):
        llm.generate(
            {"prompt": prompt, "videos": [frames[:1]], "mm_processor_kwargs": {"min_frames": 2}},
            GREEDY,
            use_tqdm=False,
        )


def test_pixels_match_torchvision():
    pytest.importorskip("torchvision")
    path = resolve_model_path(MODEL)
    proc = SmolVLMVideoProcessor.from_pretrained(path)
    rng = np.random.default_rng(0)
    for shape in [(3, 48, 64, 3), (2, 90, 40, 3), (2, 64, 64, 3)]:
        frames = rng.integers(0, 256, shape, dtype=np.uint8)
        want = proc(videos=[frames], return_tensors="pt", do_sample_frames=False)
        got = preprocess_smolvlm_video(frames, settings(path))
        torch.testing.assert_close(torch.from_numpy(got), want["pixel_values"][0], rtol=0, atol=0)


def test_served_video_chat_answers_as_the_offline_api(serve_model):
    expected = offline_answer(MODEL)
    with serve_model(MODEL) as server:
        assert served_answer(server.url, MODEL) == expected
