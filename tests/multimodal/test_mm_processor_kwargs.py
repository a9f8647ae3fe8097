"""Per-request ``mm_processor_kwargs``: applied to that request's images, part of their cache
keys (never sharing embeddings or KV blocks across settings), token-identical to transformers
with the same settings, validated by key and value."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from mmserve import LLM, SamplingParams
from mmserve.inputs import PromptInput
from tests.models.test_qwen2_vl import PAD, QwenReference, chat_prompt
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

MODEL = "tiny-qwen2-vl"
GREEDY = SamplingParams(temperature=0, max_tokens=12)
SMALL = {"max_pixels": 28 * 28 * 16}  # 224 x 224 -> 112 x 112: 16 embeddings instead of 64


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL, seed=0)


def test_same_image_two_settings_two_encodes_and_transformers_parity(llm):
    image = make_image(11, (224, 224))
    prompt = chat_prompt(1)
    base = {"prompt": prompt, "images": [image]}
    plain = llm.generate(base, GREEDY, use_tqdm=False)[0]
    small = llm.generate({**base, "mm_processor_kwargs": SMALL}, GREEDY, use_tqdm=False)[0]
    assert plain.prompt_token_ids.count(PAD) == 64 and small.prompt_token_ids.count(PAD) == 16
    assert small.num_cached_tokens == 0  # the image's blocks hash differently
    assert llm.get_metrics()["encoder_images_encoded"] == 2
    for kwargs, out in (({}, plain), (SMALL, small)):
        ref = QwenReference(MODEL, **kwargs)
        assert out.prompt_token_ids == ref.inputs(prompt, [image])["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == ref.greedy(prompt, [image], 12)
    again = llm.generate({**base, "mm_processor_kwargs": SMALL}, GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == small.outputs[0].token_ids
    assert again.num_cached_tokens > 0  # same setting: its blocks and embeddings are shared
    assert llm.get_metrics()["encoder_images_encoded"] == 2
    # the engine's own setting spelled out is the engine's setting: same keys as no kwargs
    default = llm.engine.processor.check_mm_kwargs({})
    assert default is None
    assert_no_leaks(llm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": {"longest_edge": 10}}, "unknown key 'size'"),
        ({"max_pixels": -4}, "max_pixels must be a positive integer"),
        ({"max_pixels": "many"}, "max_pixels must be a positive integer"),
        ({"min_pixels": 28 * 28 * 64, "max_pixels": 28 * 28 * 16}, "min_pixels .* <= max_pixels"),
    ],
)
def test_bad_kwargs_are_value_errors_naming_the_field(llm, kwargs, match):
    request = {"prompt": chat_prompt(1), "images": [make_image(1)], "mm_processor_kwargs": kwargs}
    with pytest.raises(ValueError, match=f"mm_processor_kwargs: {match}"):
        llm.generate(request, GREEDY, use_tqdm=False)
    assert_no_leaks(llm)


def test_llava_takes_no_processor_kwargs():
    llava = LLM("tiny-llava")
    request = {"prompt": "USER: <image>\nHi ASSISTANT:", "images": [make_image(2)]}
    with pytest.raises(ValueError, match="unknown key 'max_pixels'.*accepted: none"):
        llava.generate({**request, "mm_processor_kwargs": {"max_pixels": 1000}}, GREEDY)


def test_kwargs_beyond_the_encoder_budget_are_the_budget_error():
    llm = LLM(MODEL, processor_kwargs={"max_pixels": 28 * 28 * 64}, max_num_batched_tokens=64)
    # 113 embeddings at most per image (a 1:200 image keeps a 28-pixel side), 2 per step
    assert llm.engine.encoder_budget == 226
    request = {
        "prompt": chat_prompt(1),
        "images": [make_image(3, (448, 448))],
        "mm_processor_kwargs": {"max_pixels": 28 * 28 * 256},
    }
    with pytest.raises(ValueError, match="an image needs 256 embeddings"):
        llm.generate(request, GREEDY, use_tqdm=False)
    assert_no_leaks(llm)


def test_video_sampling_kwargs_leave_the_image_keys_alone(llm):
    """A request's video sampling keys (``fps`` & co.) do not change its images: the same image
    with and without them is one memo entry, one encode and the same prefix blocks (by content
    and by uuid), with the same output; an engine's own ``fps`` leaves image keys alone too."""
    image = png(make_image(12, (224, 224)))
    prompt = chat_prompt(1)
    video = {"fps": 4.0, "max_frames": 16}
    encoded = llm.get_metrics()["encoder_images_encoded"]
    for uuids in (None, ["photo"]):
        base = {"prompt": prompt, "images": [image], "uuids": uuids}
        plain = llm.generate(base, GREEDY, use_tqdm=False)[0]
        hits = llm.engine.processor.memo.hits
        framed = llm.generate({**base, "mm_processor_kwargs": video}, GREEDY, use_tqdm=False)[0]
        assert llm.engine.processor.memo.hits == hits + 1  # not decoded nor preprocessed again
        assert framed.num_cached_tokens > 0  # the image's blocks hash the same
        assert framed.outputs[0].token_ids == plain.outputs[0].token_ids
    assert llm.get_metrics()["encoder_images_encoded"] == encoded + 2  # content key, uuid key
    with_fps = LLM(MODEL, processor_kwargs={"fps": 1.0})
    for uuids in (None, ["photo"]):
        key = llm.engine.intake.process(PromptInput(prompt, [image], uuids)).mm_items[0].hash
        assert (
            with_fps.engine.intake.process(PromptInput(prompt, [image], uuids)).mm_items[0].hash
            == key
        )
    assert_no_leaks(llm)


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()
