"""Qwen2-VL pieces without the engine loop: M-RoPE vs transformers, token budgets, presets."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

from mmserve.engine.setup.loading import build_model_config
from mmserve.engine_args import EngineArgs
from mmserve.inputs import PromptInput
from mmserve.layers.mrope import MRotaryEmbedding, mrope_positions
from mmserve.models.qwen2_vl import ImageLimits, max_image_tokens
from mmserve.models.tiny import QWEN_SPECIAL_TOKEN_IDS, build_preset, count_parameters
from mmserve.multimodal.budget import compute_encoder_budget
from tests.support.images import make_image

MODEL = "tiny-qwen2-vl"
DEFAULT_LIMITS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}  # released Qwen2-VL
PAD = QWEN_SPECIAL_TOKEN_IDS["<|image_pad|>"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_preset(MODEL, tmp_path_factory.mktemp("ckpt") / MODEL)


@pytest.fixture(scope="module")
def hf_model(ckpt: Path) -> Qwen2VLForConditionalGeneration:
    return Qwen2VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()


# ---- M-RoPE -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_mrope_positions_match_get_rope_index(hf_model, seed):
    rng = random.Random(seed)
    ids, grids, images = [], [], []
    for _ in range(rng.randint(0, 4)):
        ids += [rng.randint(10, 100) for _ in range(rng.randint(1, 7))]
        t, h, w = 1, 2 * rng.randint(1, 9), 2 * rng.randint(1, 9)
        images.append((len(ids), (t, h // 2, w // 2)))
        grids.append([t, h, w])
        ids += [PAD] * (t * h * w // 4)
    ids += [rng.randint(10, 100) for _ in range(rng.randint(1, 7))]
    input_ids = torch.tensor([ids])
    mine = mrope_positions(len(ids), images)
    if not images:  # transformers uses plain positions (and delta 0) without images
        assert torch.equal(mine.table, torch.arange(len(ids)).expand(3, -1))
        assert mine.delta == 0
        return
    expected, delta = hf_model.model.get_rope_index(
        input_ids, (input_ids == PAD).int(), image_grid_thw=torch.tensor(grids)
    )
    assert torch.equal(mine.table, expected[:, 0])
    assert mine.delta == int(delta)


def test_mrope_slices_cover_chunks_and_decode():
    pos = mrope_positions(30, [(3, (1, 3, 4)), (17, (1, 2, 2))])
    chunks = [pos.slice(a, b) for a, b in ((0, 7), (7, 16), (16, 30), (30, 31), (31, 33))]
    whole = torch.cat(chunks, dim=1)
    assert torch.equal(whole[:, :30], pos.table)
    assert whole[:, 30:].tolist() == [[30 + pos.delta, 31 + pos.delta, 32 + pos.delta]] * 3
    assert torch.equal(pos.slice(28, 32)[:, :2], pos.table[:, 28:])
    # text after image 1 resumes at start + max(h, w): 3 + 4 = 7 at token 15
    assert pos.table[:, 15].tolist() == [7, 7, 7]
    assert pos.delta == int(pos.table.max()) + 1 - 30


def test_mrotary_bit_identical_to_transformers(hf_model):
    text = hf_model.config.text_config
    ref = Qwen2VLRotaryEmbedding(text)
    head_dim = text.hidden_size // text.num_attention_heads
    mine = MRotaryEmbedding(head_dim, text.rope_parameters["rope_theta"], [4, 6, 6])
    positions = torch.randint(0, 5000, (3, 257))
    x = torch.zeros(1, 257, head_dim)
    cos_ref, sin_ref = ref(x, positions[:, None, :])
    cos, sin = mine(positions, torch.float32)
    assert torch.equal(cos, cos_ref[0]) and torch.equal(sin, sin_ref[0])
    flat = torch.arange(100)  # 1-D positions: plain RoPE, equal to three equal rows
    assert torch.equal(mine(flat, torch.float32)[0], mine(flat.expand(3, -1), torch.float32)[0])


# ---- token counts and budgets -------------------------------------------------------------
def _brute_force_max(min_pixels: int, max_pixels: int, samples: int = 20000) -> int:
    rng = random.Random(0)
    sizes = [(k, 200 * k) for k in range(1, 200)]
    sizes += [
        (a * 28, b * 28)
        for a in range(1, 40)
        for b in range(a, 200 * a)
        if a * b * 784 <= max_pixels
    ][-3000:]
    for _ in range(samples):
        h = rng.randint(1, 3000)
        w = max(1, min(200 * h, int(h * math.exp(rng.uniform(0, math.log(200))))))
        sizes.append((h, w))
    return max(math.prod(smart_resize(h, w, 28, min_pixels, max_pixels)) // 784 for h, w in sizes)


@pytest.mark.parametrize(
    "min_pixels,max_pixels",
    [(3136, 1003520), (3136, 448 * 448), (3136, 3136), (28 * 28 * 100, 28 * 28 * 101)],
)
def test_max_image_tokens_is_exact(min_pixels, max_pixels):
    bound = max_image_tokens(ImageLimits(min_pixels, max_pixels, 14, 2))
    assert bound == _brute_force_max(min_pixels, max_pixels)


def test_hd_images_with_default_processor_limits():
    counts = {
        name: math.prod(smart_resize(h, w, 28, **DEFAULT_LIMITS)) // 784
        for name, (w, h) in {
            "720p": (1280, 720),
            "1080p": (1920, 1080),
            "1440p": (2560, 1440),
        }.items()
    }
    assert counts == {"720p": 1196, "1080p": 1222, "1440p": 1222}
    assert max_image_tokens(ImageLimits(**DEFAULT_LIMITS, patch_size=14, merge_size=2)) == 1280


def test_max_tokens_per_image_reads_checkpoint_and_kwargs(ckpt):
    assert build_model_config(str(ckpt)).max_tokens_per_image == 256  # max_pixels 448*448
    config = build_model_config(str(ckpt), processor_kwargs=DEFAULT_LIMITS)
    assert config.max_tokens_per_image == 1280
    sized = build_model_config(
        str(ckpt), processor_kwargs={"size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 400}}
    )
    assert sized.max_tokens_per_image == 400
    with pytest.raises(ValueError, match="merge_size"):
        build_model_config(str(ckpt), processor_kwargs={"merge_size": 1})


@pytest.mark.parametrize("batch,expected", [(2048, 3 * 1280), (8192, 8 * 1280)])
def test_encoder_budget_with_default_processor_limits(ckpt, batch, expected):
    model_config = build_model_config(str(ckpt), processor_kwargs=DEFAULT_LIMITS)
    sched = EngineArgs(max_num_batched_tokens=batch, max_num_seqs=64).scheduler_config()
    # ceil(batch / 1280) items + 1 for a shared-prefix recompute: 2048 -> 3, 8192 -> 8.
    assert compute_encoder_budget(model_config, sched) == (expected, expected)


def test_input_processor_expands_pad_per_image(ckpt):
    from mmserve.engine.loop.llm_engine import LLMEngine

    engine = LLMEngine.from_args(str(ckpt))
    prompt = (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>a"
        "<|vision_start|><|image_pad|><|vision_end|>b<|im_end|>\n"
    )
    out = engine.intake.process(
        PromptInput(prompt, [make_image(0, (224, 224)), make_image(1, (480, 320))])
    )
    first, second = out.mm_items
    assert (first.length, second.length) == (64, 187)
    assert first.data["image_grid_thw"] == (1, 16, 16)
    assert first.data["pixel_values"].shape == (256, 3 * 2 * 14 * 14)
    assert out.prompt_token_ids[first.offset - 1] == QWEN_SPECIAL_TOKEN_IDS["<|vision_start|>"]
    assert out.prompt_token_ids[first.offset : first.end] == [PAD] * 64
    assert out.prompt_token_ids[first.end] == QWEN_SPECIAL_TOKEN_IDS["<|vision_end|>"]
    assert out.prompt_token_ids.count(PAD) == 64 + 187
    with pytest.raises(ValueError, match="placeholder"):
        engine.intake.process(PromptInput(prompt, [make_image(0)]))


# ---- presets ------------------------------------------------------------------------------
def test_preset_layout_and_determinism(ckpt, tmp_path):
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "mmserve_preset.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    assert config["image_token_id"] == PAD
    assert config["text_config"]["rope_parameters"]["mrope_section"] == [4, 6, 6]
    pre = json.loads((ckpt / "preprocessor_config.json").read_text())
    assert pre["size"] == {"shortest_edge": 3136, "longest_edge": 448 * 448}
    other = build_preset(MODEL, tmp_path / "again")
    for path in ckpt.iterdir():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert hashlib.sha256((other / path.name).read_bytes()).hexdigest() == digest, path.name
    assert 500_000 <= count_parameters(MODEL) <= 2_000_000
    assert 13_000_000 <= count_parameters("tiny-qwen2-vl-small") <= 17_000_000


def test_preset_loads_in_transformers_and_renders_chat(ckpt):
    _, info = Qwen2VLForConditionalGeneration.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    for token, idx in QWEN_SPECIAL_TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == idx
        assert tokenizer(token).input_ids == [idx]  # no bos, one id each
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "Compare"},
                {"type": "image"},
                {"type": "text", "text": " these."},
            ],
        },
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "Why?"},
    ]
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        f"<|im_start|>user\n{vision}Compare{vision} these.<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
