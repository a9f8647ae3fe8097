"""SmolVLM (Idefics3): greedy output token-identical to transformers'
Idefics3ForConditionalGeneration (float32) on the tiny preset, with images split into tiles plus
the global image (grids 3x3 and 2x3), several images per prompt and text only, under every
cache setting; prompts equal the processor's; each image is one encoder-cache entry."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmserve import LLM, SamplingParams
from mmserve.models.tiny import resolve_model_path
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image
from tests.support.server import image_messages, openai_client

MODEL = "tiny-smolvlm"
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)
# (width, height): resized to 192 on the long side, then 64-pixel tiles: 3x3, 3x3, 2x3, 3x3
SIZES = [(96, 80), (64, 64), (120, 50), (70, 90)]


class SmolVLMReference:
    """transformers' Idefics3 and the checkpoint's own processor: the ground truth."""

    def __init__(self, model: str = MODEL) -> None:
        from transformers import AutoProcessor, Idefics3ForConditionalGeneration

        path = resolve_model_path(model)
        self.processor = AutoProcessor.from_pretrained(path)
        self.model = Idefics3ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32
        ).eval()
        self._greedy: dict[tuple, list[int]] = {}

    def inputs(self, prompt: str, images: list[Image.Image], **kwargs: object) -> dict:
        return dict(
            self.processor(text=prompt, images=images or None, return_tensors="pt", **kwargs)
        )

    def greedy(self, prompt: str, images: list[Image.Image], **kwargs: object) -> list[int]:
        key = (prompt, tuple(map(id, images)), tuple(sorted(kwargs.items())))
        if key not in self._greedy:
            inputs = self.inputs(prompt, images, **kwargs)
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
            self._greedy[key] = out[0, inputs["input_ids"].shape[1] :].tolist()
        return self._greedy[key]


@pytest.fixture(scope="module")
def ref() -> SmolVLMReference:
    return SmolVLMReference()


@pytest.fixture(scope="module")
def imgs() -> list[Image.Image]:
    return [make_image(20 + i, size) for i, size in enumerate(SIZES)]


def turn(text: str, n_images: int = 0) -> str:
    """One user turn as SmolVLM's chat template writes it (images first)."""
    colon = ":" if n_images else ": "
    return f"<|im_start|>User{colon}{'<image>' * n_images}{text}<end_of_utterance>\nAssistant:"


def cases(images: list[Image.Image]) -> list[tuple[str, list[Image.Image]]]:
    return [
        (turn("Describe this picture.", 1), images[:1]),
        (turn("Compare the two pictures, then tell me which one is brighter.", 2), images[1:3]),
        (turn("Tell me a long story about a red cube that met a blue ball in a park."), []),
        (
            "<|im_start|>User: First look at this one <image> and now this one <image> and say"
            " what changed.<end_of_utterance>\nAssistant:",
            [images[3], images[2]],
        ),
    ]


def check_parity(llm: LLM, ref: SmolVLMReference, batch: list[tuple[str, list]]) -> list:
    outs = llm.generate([{"prompt": p, "images": i} for p, i in batch], GREEDY, use_tqdm=False)
    for (prompt, images), out in zip(batch, outs, strict=True):
        assert out.prompt_token_ids == ref.inputs(prompt, images)["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == ref.greedy(prompt, images), prompt
    assert_no_leaks(llm)
    return outs


CACHE_SETTINGS = {
    "default": {},
    "encoder-cache-off": {"enable_encoder_cache": False},
    "prefix-cache-off": {"enable_prefix_caching": False},
    # chunks of 37 tokens: an image's text (up to 205 tokens) spans several chunks
    "small-chunks": {"max_num_batched_tokens": 37, "block_size": 4},
    "preemption": {"num_kv_blocks": 72, "block_size": 8, "max_model_len": 400},
}


@pytest.mark.parametrize("setting", sorted(CACHE_SETTINGS))
def test_parity_under_cache_settings(ref, imgs, setting):
    llm = LLM(MODEL, seed=0, **CACHE_SETTINGS[setting])
    check_parity(llm, ref, cases(imgs))
    if setting == "preemption":
        assert llm.get_metrics()["num_preemptions"] > 0


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_an_image_is_one_encoder_cache_entry(ref, imgs, prefix_cache):
    """The tiles and the global image of an image are encoded once, as one item; a second
    request with the same image takes it from the encoder cache (or the prefix cache)."""
    llm = LLM(MODEL, seed=0, block_size=4, enable_prefix_caching=prefix_cache)
    check_parity(llm, ref, [(turn("Describe this picture.", 1), imgs[:1])])
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 1
    second = check_parity(llm, ref, [(turn("What colors are in it?", 1), imgs[:1])])
    assert llm.get_metrics()["encoder_images_encoded"] == 1
    if prefix_cache:
        assert second[0].num_cached_tokens > 100  # the blocks through the image's text
    else:
        assert llm.get_metrics()["encoder_cache_hits"] >= 1


def test_without_image_splitting(ref, imgs):
    """``do_image_splitting: false`` (engine setting): one tile per image, the global one."""
    kwargs = {"do_image_splitting": False}
    llm = LLM(MODEL, seed=0, processor_kwargs=kwargs)
    prompt = turn("Describe this picture.", 1)
    out = llm.generate([{"prompt": prompt, "images": imgs[2:3]}], GREEDY, use_tqdm=False)[0]
    inputs = ref.inputs(prompt, imgs[2:3], do_image_splitting=False)
    assert inputs["pixel_values"].shape[1] == 1
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == ref.greedy(prompt, imgs[2:3], do_image_splitting=False)


def test_token_id_prompts(ref, imgs):
    """A token-id prompt may hold the processor's expansion already (used as is) or bare
    ``<image>`` tokens, which mmserve expands; another expansion is refused."""
    llm = LLM(MODEL, seed=0)
    prompt = turn("Describe this picture.", 1)
    expanded = ref.inputs(prompt, imgs[:1])["input_ids"][0].tolist()
    bare = ref.processor.tokenizer(prompt)["input_ids"]
    outs = llm.generate(
        [
            {"prompt_token_ids": expanded, "images": imgs[:1]},
            {"prompt_token_ids": bare, "images": imgs[:1]},
        ],
        GREEDY,
        use_tqdm=False,
    )
    for out in outs:
        assert out.prompt_token_ids == expanded
        assert out.outputs[0].token_ids == ref.greedy(prompt, imgs[:1])
    wrong = list(expanded)
    wrong[wrong.index(7)] = 8  # <row_1_col_1> -> <row_1_col_2>
    with pytest.raises(ValueError, match="not in the prompt as its processor writes it"):
        llm.generate([{"prompt_token_ids": wrong, "images": imgs[:1]}], GREEDY)
    with pytest.raises(ValueError, match="2 image placeholder"):
        llm.generate([{"prompt": turn("Two?", 2), "images": imgs[:1]}], GREEDY)


def test_chat_matches_apply_chat_template(ref, imgs):
    llm = LLM(MODEL, seed=0)
    content = [
        {"type": "image", "image": imgs[0]},
        {"type": "text", "text": "What is in this picture?"},
    ]
    out = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False)[0]
    inputs = ref.processor.apply_chat_template(
        [{"role": "user", "content": content}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    with torch.inference_mode():
        want = ref.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    assert out.outputs[0].token_ids == want[0, inputs["input_ids"].shape[1] :].tolist()


def test_server_chat_completion(ref, serve_model):
    messages = image_messages(3, SIZES[2])
    pil = [make_image(3, SIZES[2])]
    prompt = turn("What is in the picture?", 1)
    expected = ref.greedy(prompt, pil)
    with serve_model(MODEL) as srv:
        resp = openai_client(srv).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=MAX_NEW, temperature=0
        )
    assert resp.usage.prompt_tokens == len(ref.inputs(prompt, pil)["input_ids"][0])
    text = ref.processor.tokenizer.decode(expected, skip_special_tokens=True)
    assert resp.choices[0].message.content == text
