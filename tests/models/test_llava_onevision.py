"""LLaVA-OneVision and LLaVA-NeXT (the anyres families): greedy output of mmserve equals
transformers' generate (float32) for images of several aspect ratios (different crop grids,
unpadding and, for OneVision, shrinking) and several images per prompt (one sample: OneVision's
multi-image mode, see ``test_llava_onevision_multi_image``), under every cache setting;
placeholder counts, budgets and the anyres geometry. Every test not about one family's files
runs on both CI presets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor
from transformers import LlavaNextForConditionalGeneration as HFNext
from transformers import LlavaOnevisionForConditionalGeneration as HFOnevision

from mmserve import LLM, SamplingParams
from mmserve.config import SchedulerConfig
from mmserve.engine.setup.loading import build_model_config
from mmserve.models.registry import resolve_architecture
from mmserve.models.tiny import resolve_model_path
from mmserve.models.tiny.families.llava_onevision import load_onevision_processor
from mmserve.multimodal.budget import compute_encoder_budget
from mmserve.multimodal.image.anyres import AnyresGeometry, anyres_inputs, hf_anyres
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image
from tests.support.server import image_messages, openai_client

MODEL = "tiny-llava-onevision"
NEXT = "tiny-llava-next"
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)
# (width, height) -> crop grid (rows x cols) on the tiny preset: 3x3 and 2x3 are shrunk by the
# anyres_max_4 cap, 2x2 is not; 1x3 / 3x1 are unpadded across their long side.
SIZES = [(96, 80), (64, 64), (120, 50), (200, 30), (30, 200), (70, 90)]


class AnyresReference:
    """transformers' model + the checkpoint's processor (tokenizer, PIL image processor)."""

    def __init__(self, model: str) -> None:
        path = resolve_model_path(model)
        if model == NEXT:
            self.processor = AutoProcessor.from_pretrained(path)
            self.model = HFNext.from_pretrained(path, dtype=torch.float32).eval()
        else:
            self.processor = load_onevision_processor(path)
            self.model = HFOnevision.from_pretrained(path, dtype=torch.float32).eval()
        self._greedy: dict[tuple, list[int]] = {}

    def inputs(self, prompt: str, images: list[Image.Image]) -> dict:
        """The prompt's images as one sample (what ``apply_chat_template`` passes): OneVision's
        processor takes several in its multi-image mode (NeXT's has none)."""
        onevision = self.model.config.model_type == "llava_onevision"
        sample = [images] if images and onevision else images
        return dict(self.processor(text=prompt, images=sample or None, return_tensors="pt"))

    def greedy(self, prompt: str, images: list[Image.Image]) -> list[int]:
        key = (prompt, tuple(map(id, images)))
        if key not in self._greedy:
            inputs = self.inputs(prompt, images)
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
            self._greedy[key] = out[0, inputs["input_ids"].shape[1] :].tolist()
        return self._greedy[key]


_REFERENCES: dict[str, AnyresReference] = {}


def reference(model: str) -> AnyresReference:
    if model not in _REFERENCES:
        _REFERENCES[model] = AnyresReference(model)
    return _REFERENCES[model]


@pytest.fixture(scope="module", params=[MODEL, NEXT])
def family(request) -> str:
    """Both families the anyres code serves."""
    return request.param


@pytest.fixture(scope="module")
def ref(family: str) -> AnyresReference:
    return reference(family)


@pytest.fixture(scope="module")
def imgs() -> list[Image.Image]:
    return [make_image(10 + i, size) for i, size in enumerate(SIZES)]


def chat_prompt(n_images: int, question: str = "What is in the picture?", model=MODEL) -> str:
    if model == NEXT:
        return "USER: " + "<image>\n" * n_images + question + " ASSISTANT:"
    return f"<|im_start|>user {'<image>' * n_images}\n{question}<|im_end|><|im_start|>assistant\n"


def check_parity(llm: LLM, ref: AnyresReference, cases: list[tuple[str, list]]) -> list:
    outs = llm.generate(
        [{"prompt": p, "images": imgs} for p, imgs in cases], GREEDY, use_tqdm=False
    )
    for (prompt, images), out in zip(cases, outs, strict=True):
        assert out.prompt_token_ids == ref.inputs(prompt, images)["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == ref.greedy(prompt, images), prompt
    assert_no_leaks(llm)
    return outs


def test_every_grid_one_image_each_and_several_per_prompt(family, ref, imgs):
    llm = LLM(family, max_num_batched_tokens=2048, seed=0)
    cases = [
        (chat_prompt(1, f"Describe picture {i}.", model=family), [img])
        for i, img in enumerate(imgs)
    ]
    cases += [
        (chat_prompt(3, "Compare them.", model=family), [imgs[0], imgs[2], imgs[3]]),
        (chat_prompt(2, "Which is wider?", model=family), [imgs[4], imgs[1]]),
        (chat_prompt(0, "No picture here.", model=family), []),
    ]
    check_parity(llm, ref, cases)


CACHES = list(itertools.product([True, False], [True, False]))


@pytest.mark.parametrize(("encoder_cache", "prefix_cache"), CACHES)
def test_shared_image_prefix_under_cache_settings(family, ref, imgs, encoder_cache, prefix_cache):
    """A second request sharing the first's image prefix: answers never depend on caching;
    the encoder cache serves both images again, the prefix cache the first one."""
    llm = LLM(
        family,
        max_num_batched_tokens=2048,
        enable_encoder_cache=encoder_cache,
        enable_prefix_caching=prefix_cache,
    )
    shared = [imgs[0], imgs[2]]
    check_parity(llm, ref, [(chat_prompt(2, "What is common?", model=family), shared)])
    encoded = llm.get_metrics()["encoder_images_encoded"]
    outs = check_parity(
        llm, ref, [(chat_prompt(2, "What differs between them?", model=family), shared)]
    )
    again = llm.get_metrics()["encoder_images_encoded"] - encoded
    if prefix_cache:
        assert outs[0].num_cached_tokens > 0
    if encoder_cache:
        assert again == 0
    elif prefix_cache:  # the first image lies in cached blocks; the second ends in the tail
        assert again == 1
    else:
        assert again == 2


@pytest.mark.parametrize("budget", [37, 64])
def test_image_spanning_several_chunks(family, ref, imgs, budget):
    llm = LLM(family, max_num_batched_tokens=budget, max_num_seqs=4)
    cases = [
        (chat_prompt(2, "What changed?", model=family), [imgs[1], imgs[2]]),
        (chat_prompt(1, model=family), [imgs[3]]),
    ]
    check_parity(llm, ref, cases)


def test_preemption(family, ref, imgs):
    # Prompts of ~100-120 tokens take 7-8 blocks: four do not fit 24 blocks with their decodes.
    llm = LLM(family, num_kv_blocks=24, block_size=16, max_model_len=384)
    cases = [(chat_prompt(1, f"Question {i}?", model=family), [imgs[i]]) for i in range(4)]
    check_parity(llm, ref, cases)
    assert llm.get_metrics()["num_preemptions"] > 0


# ---- geometry, budgets, mismatches ----------------------------------------------------------
@pytest.fixture(scope="module")
def model_config(family: str):
    return build_model_config(family)


def test_max_tokens_bounds_every_image_size_and_is_attained(model_config):
    """The budget bound is the true maximum over every image size up to 6 crops a side."""
    geometry = AnyresGeometry.from_config(model_config.hf_config)
    counts = [geometry.num_tokens(h, w) for h in range(1, 193, 1) for w in range(1, 193, 3)]
    assert model_config.max_tokens_per_image == geometry.max_tokens() == max(counts)


def test_encoder_budget_holds_the_largest_image(model_config):
    sched = SchedulerConfig(64, 4, False, None, None, {"image": 4}, None)
    compute, cache = compute_encoder_budget(model_config, sched)
    assert compute >= model_config.max_tokens_per_image
    assert cache >= model_config.max_tokens_per_image


def test_placeholder_count_matches_the_processor(ref, model_config, imgs):
    """Admission's count = transformers' processor's ``<image>`` expansion, every grid."""
    image_token = model_config.image_token_id
    for img in imgs:
        expected = int((ref.inputs(chat_prompt(1), [img])["input_ids"] == image_token).sum())
        processed = hf_anyres(ref.processor.image_processor, img)
        _, length = anyres_inputs(processed, ref.processor.image_processor, model_config)
        assert length == expected, img.size


EXTREME_SIZES = [(1000, 1), (1, 1000), (300, 4), (4, 300), (2, 2)]  # nothing left after unpad


@pytest.mark.parametrize("size", EXTREME_SIZES)
def test_extreme_aspect_ratios_pack_like_transformers(family, ref, model_config, size):
    """Unpadding that leaves no row (or column) of crops' features: the count and the packed
    embeddings are still transformers'."""
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    inputs = ref.inputs(chat_prompt(1, model=family), [image])
    expected = int((inputs["input_ids"] == model_config.image_token_id).sum())
    data, length = anyres_inputs(
        hf_anyres(ref.processor.image_processor, image), None, model_config
    )
    assert length == expected
    model = resolve_architecture(model_config.hf_config)[1](model_config.hf_config)
    model.load_weights(model_config.path)
    with torch.inference_mode():
        mine = model.encode_images([data])[0]
        theirs = ref.model.model.get_image_features(
            inputs["pixel_values"], inputs["image_sizes"]
        ).pooler_output[0]
    assert mine.shape == (length, model_config.hidden_size)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_crops_that_do_not_form_the_grid_are_an_error(ref, model_config, imgs):
    crops, size = hf_anyres(ref.processor.image_processor, imgs[0])
    with pytest.raises(ValueError, match="image_grid_pinpoints differ"):
        anyres_inputs((crops[:-1], size), ref.processor.image_processor, model_config)
    model = resolve_architecture(model_config.hf_config)[1](model_config.hf_config)
    model.load_weights(model_config.path)
    with pytest.raises(ValueError, match=r"its grid is 1 \+ \dx\d crops"):
        model.encode_images([{"pixel_values": np.asarray(crops[:-1]), "image_size": size}])


def test_hub_layout_and_chat_template(imgs):
    """The files llava-hf/llava-onevision-qwen2-*-ov-hf publish; the chat template comes from
    ``chat_template.json`` and renders the hub's format (images first, then the text)."""
    path = resolve_model_path(MODEL)
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        assert (path / name).is_file(), name
    llm = LLM(MODEL)
    message = {
        "role": "user",
        "content": [{"type": "image", "image": imgs[1]}, {"type": "text", "text": "Hi?"}],
    }
    out = llm.chat([message], GREEDY, use_tqdm=False)[0]
    prompt = "<|im_start|>user <image>\nHi?<|im_end|><|im_start|>assistant\n"
    ref = reference(MODEL)
    assert out.prompt_token_ids == ref.inputs(prompt, [imgs[1]])["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == ref.greedy(prompt, [imgs[1]])


def test_server_chat_with_two_images(serve_model):
    """Through a real server on 127.0.0.1 (data URLs, the admission pools): the hub template,
    the placeholder expansion and the greedy answer are transformers'."""
    messages = image_messages(3, SIZES[2])
    messages[0]["content"].insert(0, image_messages(4, SIZES[3])[0]["content"][0])
    pil = [make_image(4, SIZES[3]), make_image(3, SIZES[2])]
    prompt = chat_prompt(2, "What is in the picture?")
    ref = reference(MODEL)
    expected = ref.greedy(prompt, pil)
    with serve_model(MODEL) as srv:
        resp = openai_client(srv).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=MAX_NEW, temperature=0
        )
    assert resp.usage.prompt_tokens == len(ref.inputs(prompt, pil)["input_ids"][0])
    text = ref.processor.tokenizer.decode(expected, skip_special_tokens=True)
    assert resp.choices[0].message.content == text
