"""Qwen2-VL and Qwen2.5-VL: greedy output of mmserve equals transformers' generate (float32,
M-RoPE), with every cache setting. Every test runs on both families' CI presets."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from mmserve import LLM, SamplingParams
from mmserve.models.tiny import QWEN_SPECIAL_TOKEN_IDS, resolve_model_path
from tests.support.engine import assert_no_leaks, engine_device
from tests.support.images import make_image

MODELS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW)
PAD = QWEN_SPECIAL_TOKEN_IDS["<|image_pad|>"]
VISION = "<|vision_start|><|image_pad|><|vision_end|>"


class QwenReference:
    """transformers' model of the checkpoint's architecture (``Qwen2VLForConditionalGeneration``
    or ``Qwen2_5_VLForConditionalGeneration``) fed by the PIL image processor + tokenizer
    (placeholders expanded here; ``mm_token_type_ids`` drives its M-RoPE positions)."""

    def __init__(self, model: str, **processor_kwargs: Any) -> None:
        import transformers
        from transformers import AutoConfig, AutoTokenizer, Qwen2VLImageProcessorPil

        path = resolve_model_path(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, **processor_kwargs)
        model_class = getattr(transformers, AutoConfig.from_pretrained(path).architectures[0])
        self.device = engine_device()
        self.model = model_class.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        self._greedy: dict[tuple, list[int]] = {}

    def inputs(self, prompt: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        ids = self.tokenizer(prompt)["input_ids"]
        kwargs: dict[str, torch.Tensor] = {}
        if images:
            out = self.image_processor(images=images, return_tensors="pt")
            counts = iter((out["image_grid_thw"].prod(-1) // 4).tolist())
            ids = [t for i in ids for t in ([i] * next(counts) if i == PAD else [i])]
            kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        input_ids = torch.tensor([ids])
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == PAD).int(),
            **kwargs,
        }

    def greedy(self, prompt: str, images: list[Image.Image], max_new: int = MAX_NEW) -> list[int]:
        """Memoized by prompt and image identity (the tests reuse their image objects)."""
        key = (prompt, tuple(map(id, images)), max_new)
        if key not in self._greedy:
            inputs = {k: v.to(self.device) for k, v in self.inputs(prompt, images).items()}
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
            self._greedy[key] = out[0, inputs["input_ids"].shape[1] :].tolist()
        return self._greedy[key]


def chat_prompt(n_images: int, question: str = "What is in the picture?") -> str:
    return f"<|im_start|>user\n{VISION * n_images}{question}<|im_end|>\n<|im_start|>assistant\n"


def check_parity(llm: LLM, ref: QwenReference, cases: list[tuple[str, list]]) -> list:
    outs = llm.generate(
        [{"prompt": p, "images": imgs} for p, imgs in cases], GREEDY, use_tqdm=False
    )
    for (prompt, imgs), out in zip(cases, outs, strict=True):
        assert out.prompt_token_ids == ref.inputs(prompt, imgs)["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == ref.greedy(prompt, imgs), prompt
    assert_no_leaks(llm)
    return outs


@pytest.fixture(scope="module", params=MODELS)
def model(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def ref(model) -> QwenReference:
    return QwenReference(model)


@pytest.fixture(scope="module")
def llm(model) -> LLM:
    return LLM(model, max_num_batched_tokens=2048, max_num_seqs=64, seed=0)


@pytest.fixture(scope="module")
def imgs() -> dict[str, Image.Image]:
    sizes = {
        "square": (224, 224),
        "portrait": (320, 480),
        "wide": (640, 360),
        "tiny": (30, 20),
        "hd": (1280, 720),
    }
    out = {name: make_image(i, size) for i, (name, size) in enumerate(sizes.items())}
    return out | {f"q{i}": make_image(10 + i, (640, 360)) for i in range(4)}


def test_one_image(llm, ref, imgs):
    (out,) = check_parity(llm, ref, [(chat_prompt(1), [imgs["square"]])])
    assert out.prompt_token_ids.count(PAD) == 64  # 224x224 -> 8x8 merged patches


def test_three_images_of_different_sizes(llm, ref, imgs):
    images = [imgs["square"], imgs["portrait"], imgs["wide"]]
    (out,) = check_parity(llm, ref, [(chat_prompt(3, "Compare them."), images)])
    assert out.prompt_token_ids.count(PAD) == 64 + 187 + 252  # wide is capped by max_pixels


def test_text_only(llm, ref):
    check_parity(llm, ref, [("<|im_start|>user\nTell me a story.<|im_end|>\n", [])])


def test_batch_of_mixed_requests(llm, ref, imgs):
    cases = [
        (chat_prompt(1, "Describe it."), [imgs["portrait"]]),
        ("<|im_start|>user\nWhich color is the sky?<|im_end|>\n<|im_start|>assistant\n", []),
        (chat_prompt(2, "Which is brighter?"), [imgs["wide"], imgs["tiny"]]),
        ("plain text without a template", []),
        (chat_prompt(1, "Count the shapes."), [imgs["hd"]]),
        (chat_prompt(3, "Any difference?"), [imgs["tiny"], imgs["square"], imgs["portrait"]]),
        (chat_prompt(1, "Describe it."), [imgs["portrait"]]),
    ]
    check_parity(llm, ref, cases)


@pytest.mark.parametrize("budget", [64, 37])
def test_image_split_across_chunks(model, ref, imgs, budget):
    # 187 / 252 embeddings per image: every image spans 3+ chunks, chunk ends fall inside them.
    llm = LLM(model, max_num_batched_tokens=budget, max_num_seqs=4)
    cases = [
        (chat_prompt(2, "What changed?"), [imgs["portrait"], imgs["wide"]]),
        (chat_prompt(1), [imgs["square"]]),
    ]
    check_parity(llm, ref, cases)


def test_image_reused_across_requests_and_turns(model, ref, imgs):
    llm = LLM(model, max_num_batched_tokens=2048)
    image = imgs["portrait"]
    turn1 = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": image},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]
    out1 = llm.chat(turn1, GREEDY, use_tqdm=False)[0]
    turn2 = turn1 + [
        {"role": "assistant", "content": out1.outputs[0].text},
        {"role": "user", "content": "Are you sure?"},
    ]
    out2 = llm.chat(turn2, GREEDY, use_tqdm=False)[0]
    assert llm.get_metrics()["prefix_cache_hits"] > 0  # turn 2 reuses turn 1's KV blocks
    # Same image after a different prefix: no KV hit covers it, the encoder cache serves it.
    prompt3 = "<|im_start|>system\nBe brief.<|im_end|>\n" + chat_prompt(1, "Again?")
    out3 = llm.generate({"prompt": prompt3, "images": [image]}, GREEDY, use_tqdm=False)[0]
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 1, metrics
    assert metrics["encoder_cache_hits"] >= 1, metrics
    render = ref.tokenizer.apply_chat_template
    for conv, out in ((turn1, out1), (turn2, out2)):
        conv = [
            {
                **m,
                "content": [
                    {"type": "image"} if p.get("type") == "image" else p for p in m["content"]
                ],
            }
            if isinstance(m["content"], list)
            else m
            for m in conv
        ]
        prompt = render(conv, add_generation_prompt=True, tokenize=False)
        assert out.outputs[0].token_ids == ref.greedy(prompt, [image])
    assert out3.outputs[0].token_ids == ref.greedy(prompt3, [image])
    assert_no_leaks(llm)


def test_preemption(model, ref, imgs):
    # ~275-token prompts take 18 blocks each: two fit in 37 blocks, but their decodes soon
    # need more, so the newer one is preempted and recomputed (positions rebuilt incl. output).
    llm = LLM(model, num_kv_blocks=37, block_size=16, max_model_len=592, max_num_batched_tokens=512)
    cases = [(chat_prompt(1, f"Question {i}?"), [imgs[f"q{i}"]]) for i in range(4)]
    check_parity(llm, ref, cases)
    assert llm.get_metrics()["num_preemptions"] > 0


def test_processor_kwargs_limit_pixels(model, imgs):
    kwargs = {"min_pixels": 28 * 28 * 16, "max_pixels": 28 * 28 * 64}
    llm = LLM(model, processor_kwargs=kwargs)
    # Not 64: a 1:200 image keeps a 28-pixel short side when scaled down, 28 x 3164 pixels.
    assert smart_resize(20, 4000, 28, **kwargs) == (28, 3164)
    assert llm.engine.config.model.max_tokens_per_image == 3164 // 28 == 113
    ref = QwenReference(model, **kwargs)
    cases = [(chat_prompt(2), [imgs["hd"], imgs["tiny"]])]
    (out,) = check_parity(llm, ref, cases)
    assert out.prompt_token_ids.count(PAD) == 60 + 20  # 1280x720 -> 6x10, 30x20 -> 4x5 (up)


def test_image_over_encoder_budget_is_rejected(model, imgs):
    llm = LLM(model)
    llm.engine.encoder_budget = 100  # as if the budget were smaller than a 187-embedding image
    with pytest.raises(ValueError, match="187 embeddings"):
        llm.generate(
            {"prompt": chat_prompt(1), "images": [imgs["portrait"]]}, GREEDY, use_tqdm=False
        )
    assert_no_leaks(llm)


@pytest.mark.parametrize("encoder_cache", [True, False], ids=["enc-cache", "no-enc-cache"])
@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix", "no-prefix"])
def test_cache_settings(model, ref, imgs, encoder_cache, prefix_cache):
    """Two rounds sharing images and prompt prefixes, prefilled in 48-token chunks: the second
    round hits whichever caches are on, and every answer still equals transformers'."""
    llm = LLM(
        model,
        enable_encoder_cache=encoder_cache,
        enable_prefix_caching=prefix_cache,
        max_num_batched_tokens=48,
        max_num_seqs=4,
    )
    first = [
        (chat_prompt(1, "Describe it."), [imgs["portrait"]]),
        (chat_prompt(2, "Compare."), [imgs["wide"], imgs["portrait"]]),
    ]
    second = [
        (chat_prompt(1, "Describe it."), [imgs["portrait"]]),
        (chat_prompt(2, "Which is larger?"), [imgs["wide"], imgs["portrait"]]),
        (chat_prompt(2, "And now?"), [imgs["square"], imgs["wide"]]),
    ]
    check_parity(llm, ref, first)
    check_parity(llm, ref, second)
    metrics = llm.get_metrics()
    assert (metrics["prefix_cache_hits"] > 0) == prefix_cache, metrics
    distinct = 3
    if encoder_cache:
        assert metrics["encoder_images_encoded"] == distinct, metrics
    else:
        assert metrics["encoder_images_encoded"] > distinct, metrics
