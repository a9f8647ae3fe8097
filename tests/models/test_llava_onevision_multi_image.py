"""LLaVA-OneVision's multi-image mode: the images of one prompt (a chat with several images, in
one message or across turns) are taken at base resolution only, as transformers' processor
takes the images of one sample (``need_patching = n == 1``); a lone image keeps its anyres
grid. The prompt ids are those of the checkpoint's own ``apply_chat_template(tokenize=True)``,
greedy output equals transformers' ``generate`` (float32), and an image's cache key holds the
mode, so its embeddings of one mode are never served for the other."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmserve import LLM, SamplingParams
from mmserve.engine.setup.loading import build_model_config
from mmserve.inputs import PromptInput
from mmserve.models.registry import resolve_architecture
from mmserve.multimodal.image.anyres import AnyresGeometry
from tests.models.test_llava_onevision import MODEL, reference
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)
SIZES = [(96, 80), (120, 50), (30, 200), (64, 64)]


@pytest.fixture(scope="module")
def imgs() -> list[Image.Image]:
    return [make_image(40 + i, size) for i, size in enumerate(SIZES)]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL, max_num_batched_tokens=1024, seed=0)


def turn(role: str, text: str, images: list[Image.Image] = ()) -> dict:
    parts = [{"type": "image", "image": image} for image in images]
    return {"role": role, "content": [*parts, {"type": "text", "text": text}]}


def hf_chat(conversation: list[dict]) -> tuple[list[int], list[int], dict]:
    """The checkpoint's processor's ids for ``conversation`` and transformers' greedy answer."""
    ref = reference(MODEL)
    inputs = ref.processor.apply_chat_template(
        conversation,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=True,
        return_tensors="pt",
    )
    with torch.inference_mode():
        out = ref.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    return ids, out[0, len(ids) :].tolist(), dict(inputs)


CHATS = {
    "two images in one message": lambda im: [turn("user", "Compare them.", [im[0], im[1]])],
    "three images in one message": lambda im: [turn("user", "Which?", [im[2], im[0], im[3]])],
    "one image per turn": lambda im: [
        turn("user", "What is this?", [im[0]]),
        turn("assistant", "A picture."),
        turn("user", "And this one?", [im[1]]),
    ],
    "one image": lambda im: [turn("user", "Describe it.", [im[1]])],
}


@pytest.mark.parametrize("case", list(CHATS))
def test_chat_equals_apply_chat_template_and_generate(llm, imgs, case):
    conversation = CHATS[case](imgs)
    ids, expected, inputs = hf_chat(conversation)
    out = llm.chat(conversation, GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == ids, case
    assert out.outputs[0].token_ids == expected, case
    if case != "one image":  # transformers took these images in its multi-image mode
        assert inputs["batch_num_images"].tolist() == [len(inputs["image_sizes"])]
        assert inputs["pixel_values"].shape[1] == 1  # the base crop only
    assert_no_leaks(llm)


def test_two_images_take_the_base_crop_and_a_newline_each(llm, imgs):
    """A 2-image prompt: per image the base crop's patches plus one ``image_newline`` (the
    processor's ``num_image_tokens + 1``), far fewer than the tiled image's count."""
    config = build_model_config(MODEL)
    geometry = AnyresGeometry.from_config(config.hf_config)
    prompt = "<|im_start|>user <image><image>\nHi?<|im_end|><|im_start|>assistant\n"
    items = llm.engine.intake.process(PromptInput(prompt, [imgs[0], imgs[1]])).mm_items
    assert [item.length for item in items] == [geometry.patches**2 + 1] * 2
    alone = llm.engine.intake.process(
        PromptInput(prompt.replace("<image>", "", 1), [imgs[0]])
    ).mm_items
    assert alone[0].length == geometry.num_tokens(SIZES[0][1], SIZES[0][0])
    assert alone[0].hash != items[0].hash  # the same pixels, another mode: another key
    with_uuid = llm.engine.intake.process(
        PromptInput(prompt, [imgs[0], imgs[1]], ["a", "b"])
    ).mm_items
    alone_uuid = llm.engine.intake.process(
        PromptInput(prompt.replace("<image>", "", 1), [imgs[0]], ["a"])
    )
    assert alone_uuid.mm_items[0].hash != with_uuid[0].hash


@pytest.mark.parametrize("single_first", [True, False])
def test_the_encoder_cache_never_serves_one_mode_for_the_other(imgs, single_first):
    """The same image alone (tiled) and among two (base only), either order, one engine with
    the encoder cache on: both answers are transformers', the second request encodes its
    image again, and a repeat of either request encodes nothing."""
    llm = LLM(MODEL, max_num_batched_tokens=1024, enable_prefix_caching=False)
    alone = [turn("user", "Describe it.", [imgs[0]])]
    pair = [turn("user", "Compare them.", [imgs[0], imgs[1]])]
    order = [alone, pair] if single_first else [pair, alone]
    encoded = []
    for conversation in [*order, *order]:
        _, expected, _ = hf_chat(conversation)
        before = llm.get_metrics()["encoder_images_encoded"]
        assert llm.chat(conversation, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected
        encoded.append(llm.get_metrics()["encoder_images_encoded"] - before)
    first, second = (1, 2) if single_first else (2, 1)
    assert encoded == [first, second, 0, 0]
    assert_no_leaks(llm)


def test_base_only_embeddings_are_transformers(imgs):
    """``encode_images`` of a base-only image = ``get_image_features`` with the sample's
    ``batch_num_images`` (transformers' ``pack_image_features`` without a grid)."""
    config = build_model_config(MODEL)
    llm = LLM(MODEL)
    prompt = "<|im_start|>user <image><image>\nHi?<|im_end|><|im_start|>assistant\n"
    items = llm.engine.intake.process(PromptInput(prompt, [imgs[2], imgs[3]])).mm_items
    model = resolve_architecture(config.hf_config)[1](config.hf_config)
    model.load_weights(config.path)
    ref = reference(MODEL)
    inputs = ref.processor(text=prompt, images=[[imgs[2], imgs[3]]], return_tensors="pt")
    with torch.inference_mode():
        mine = model.encode_images([item.data for item in items])
        theirs = ref.model.model.get_image_features(
            inputs["pixel_values"], inputs["image_sizes"], batch_num_images=[2]
        ).pooler_output
    for item, m, t in zip(items, mine, theirs, strict=True):
        assert m.shape == (item.length, config.hidden_size)
        torch.testing.assert_close(m, t, rtol=1e-5, atol=1e-5)
    pixels = inputs["pixel_values"].numpy()
    for item, p in zip(items, pixels, strict=True):
        assert np.array_equal(item.data["pixel_values"], p)


def test_the_budget_bound_holds_base_only_images():
    config = build_model_config(MODEL)
    geometry = AnyresGeometry.from_config(config.hf_config)
    assert geometry.patches**2 + 1 <= config.max_tokens_per_image


def test_a_video_beside_two_images_keeps_its_frames_and_drops_their_grids(imgs):
    """Videos are unchanged (frames pooled, one item each); the two images of the prompt take
    the multi-image mode, as transformers' processor takes the images of one sample."""
    from tests.models.video.test_llava_onevision_video import GREEDY as VIDEO_GREEDY
    from tests.models.video.test_llava_onevision_video import VideoReference, make_frames, prompt

    ref = VideoReference()
    video, images = make_frames(3, 3), [imgs[0], imgs[2]]
    text = prompt("Compare.", "<image><image><video>")
    llm = LLM(MODEL, limit_mm_per_prompt={"image": 2, "video": 1})
    request = {"prompt": text, "images": images, "videos": [video]}
    out = llm.generate(request, VIDEO_GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == ref.inputs(text, video, images)["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == ref.greedy(text, video, images)
    assert llm.get_metrics()["encoder_images_encoded"] == 2 + 3  # two images, three frames
    assert_no_leaks(llm)
