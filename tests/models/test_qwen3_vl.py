"""Qwen3-VL: greedy output of mmserve equals transformers' generate (float32, interleaved
M-RoPE, DeepStack) on one and several images and under every cache setting; the DeepStack
features reach every prefill chunk, also one starting inside an image."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

from mmserve import LLM, SamplingParams
from mmserve.layers.mrope_interleaved import InterleavedMRotaryEmbedding
from mmserve.models.qwen3_vl_text import Qwen3VLTextModel
from mmserve.models.tiny import count_parameters
from tests.models.test_qwen2_vl import PAD, QwenReference, chat_prompt, check_parity
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

MODEL = "tiny-qwen3-vl"
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def ref() -> QwenReference:
    return QwenReference(MODEL)


@pytest.fixture(scope="module")
def imgs() -> dict[str, Image.Image]:
    sizes = {"square": (224, 224), "portrait": (320, 480), "wide": (640, 360), "tiny": (30, 20)}
    out = {name: make_image(i, size) for i, (name, size) in enumerate(sizes.items())}
    return out | {f"q{i}": make_image(10 + i, (640, 360)) for i in range(4)}


@pytest.mark.parametrize("backend", ["auto", "torch"])  # flex passes too (16 s on CPU)
def test_one_image(ref, imgs, backend):
    llm = LLM(MODEL, seed=0, attention_backend=backend, max_num_batched_tokens=32)
    (out,) = check_parity(llm, ref, [(chat_prompt(1), [imgs["square"]])])
    assert out.prompt_token_ids.count(PAD) == 49  # 224x224 -> 7x7 merged 32-pixel patches


def test_several_images_and_text(ref, imgs):
    llm = LLM(MODEL, max_num_seqs=8, seed=0)
    cases = [
        (chat_prompt(3, "Compare them."), [imgs["square"], imgs["portrait"], imgs["wide"]]),
        ("<|im_start|>user\nTell me a story.<|im_end|>\n", []),
        (chat_prompt(2, "Which is brighter?"), [imgs["tiny"], imgs["square"]]),
    ]
    outs = check_parity(llm, ref, cases)
    assert outs[0].prompt_token_ids.count(PAD) == 49 + 150 + 220


@pytest.mark.parametrize("encoder_cache", [True, False], ids=["enc-cache", "no-enc-cache"])
@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix", "no-prefix"])
def test_cache_settings(ref, imgs, encoder_cache, prefix_cache):
    """16-token chunks (every image spans several); the second round shares the first's
    prefixes up to the end of an image, so its prefix hits end inside that image (the rest of
    the image is prefilled from the encoder cache or a fresh encode, DeepStack included)."""
    llm = LLM(
        MODEL,
        enable_encoder_cache=encoder_cache,
        enable_prefix_caching=prefix_cache,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    first = [
        (chat_prompt(1, "Describe it."), [imgs["portrait"]]),
        (chat_prompt(2, "Compare."), [imgs["wide"], imgs["square"]]),
    ]
    second = [
        (chat_prompt(2, "And this one?"), [imgs["portrait"], imgs["tiny"]]),
        (chat_prompt(1, "Only the first."), [imgs["wide"]]),
    ]
    check_parity(llm, ref, first)
    before = llm.get_metrics()["prefix_cache_hits"]
    outs = check_parity(llm, ref, second)
    if prefix_cache:  # the hit ends inside the portrait image (150 tokens)
        start = outs[0].prompt_token_ids.index(PAD)
        assert start < outs[0].num_cached_tokens < start + 150, outs[0].num_cached_tokens
    metrics = llm.get_metrics()
    assert (metrics["prefix_cache_hits"] > before) == prefix_cache, metrics
    distinct = 4
    if encoder_cache:
        assert metrics["encoder_images_encoded"] == distinct, metrics
    else:
        assert metrics["encoder_images_encoded"] > distinct, metrics


def test_preemption(ref, imgs):
    # ~240-token prompts take 15 blocks each: two fit in 32 blocks, but their decodes soon
    # need more, so the newer one is preempted and recomputed, DeepStack rows included.
    llm = LLM(MODEL, num_kv_blocks=32, block_size=16, max_model_len=512, max_num_batched_tokens=96)
    cases = [(chat_prompt(1, f"Question {i}?"), [imgs[f"q{i}"]]) for i in range(4)]
    check_parity(llm, ref, cases)
    assert llm.get_metrics()["num_preemptions"] > 0


def _prompt_logprobs(llm: LLM, prompt: str, images: list) -> torch.Tensor:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = llm.generate({"prompt": prompt, "images": images}, params, use_tqdm=False)[0]
    return torch.tensor([lp.logprob for lp in out.prompt_logprobs if lp is not None])


def test_deepstack_reaches_chunks_that_start_inside_an_image(ref, imgs, monkeypatch):
    """Prompt log-probs with 16-token chunks equal transformers' (one full forward); dropping
    the DeepStack features of chunks that start inside the image moves them far off, so the
    parity above depends on those features."""
    prompt, images = chat_prompt(1, "Describe it."), [imgs["portrait"]]
    inputs = {k: v.to(ref.device) for k, v in ref.inputs(prompt, images).items()}
    with torch.inference_mode():
        logits = ref.model(**inputs).logits[0, :-1].float().cpu()
    ids = inputs["input_ids"][0, 1:].cpu()
    expected = logits.log_softmax(-1).gather(1, ids[:, None])[:, 0]
    llm = LLM(MODEL, max_num_batched_tokens=16, enable_prefix_caching=False)
    got = _prompt_logprobs(llm, prompt, images)
    assert torch.allclose(got, expected, atol=1e-3), (got - expected).abs().max()

    forward = Qwen3VLTextModel.forward

    def drop_mid_image(self, embeds, positions, cache, meta, deepstack=None):
        if deepstack is not None and int(deepstack.rows[0]) == 0:  # chunk starts in an image
            deepstack = None
        return forward(self, embeds, positions, cache, meta, deepstack)

    monkeypatch.setattr(Qwen3VLTextModel, "forward", drop_mid_image)
    dropped = _prompt_logprobs(llm, prompt, images)
    assert (dropped - expected).abs().max() > 0.1
    assert_no_leaks(llm)


def test_budgets_follow_the_processor_limits(imgs):
    assert LLM(MODEL).engine.config.model.max_tokens_per_image == 256  # max_pixels 512 * 512
    kwargs = {"min_pixels": 32 * 32 * 16, "max_pixels": 32 * 32 * 64}
    llm = LLM(MODEL, processor_kwargs=kwargs)
    # a 1:200 image keeps a 32-pixel short side when scaled down: 32 x 3616 pixels
    assert smart_resize(20, 4000, 32, **kwargs) == (32, 3616)
    assert llm.engine.config.model.max_tokens_per_image == 3616 // 32 == 113
    hd = make_image(7, (1280, 720))
    (out,) = check_parity(
        llm, QwenReference(MODEL, **kwargs), [(chat_prompt(2), [hd, imgs["tiny"]])]
    )
    assert out.prompt_token_ids.count(PAD) == 60 + 20  # 1280x720 -> 6x10, 30x20 -> 4x5 (up)


def test_encoder_cache_budgets_wide_rows():
    llm = LLM(MODEL, encoder_cache_memory=3 * 128 * 4 * 10000)
    mc = llm.engine.config.model
    assert mc.hidden_size == 128 and llm.engine.model.deepstack_layers == 2
    assert mc.bytes_per_embedding == 128 * 3 * 4  # main embedding + 2 DeepStack features
    cache = llm.engine.scheduler.encoder_cache
    assert (cache.capacity, cache.bytes_per_embedding) == (10000, 128 * 3 * 4)


def test_param_counts():
    assert 800_000 <= count_parameters(MODEL) <= 1_500_000
    assert 15_000_000 <= count_parameters("tiny-qwen3-vl-small") <= 21_000_000


def test_interleaved_mrope_matches_transformers(ref):
    text = ref.model.config.text_config
    theirs = Qwen3VLTextRotaryEmbedding(text)
    section = text.rope_parameters["mrope_section"]
    mine = InterleavedMRotaryEmbedding(text.head_dim, 5000000.0, section)
    positions = torch.stack([torch.arange(40), torch.arange(40) // 3, torch.arange(40) % 7])
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = theirs(x, positions[:, None, :])
    assert torch.equal(mine(positions, torch.float32)[0], cos[0])
    assert torch.equal(mine(positions, torch.float32)[1], sin[0])
