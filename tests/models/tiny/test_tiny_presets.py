"""Tests for the built-in tiny random-weight LLaVA presets (mmserve.models.tiny)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoProcessor,
    AutoTokenizer,
    LlavaForConditionalGeneration,
)

from mmserve.models import tiny
from mmserve.models.tiny import (
    BUILD_VERSION,
    PRESET_NAMES,
    SPECIAL_TOKEN_IDS,
    build_model,
    build_preset,
    count_parameters,
    resolve_model_path,
)
from mmserve.models.tiny import cache as tiny_cache

PRESET = "tiny-llava"
IMAGE_ID = SPECIAL_TOKEN_IDS["<image>"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_preset(PRESET, tmp_path_factory.mktemp("ckpt") / PRESET)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _image(seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8))


def _messages() -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}],
        }
    ]


def test_layout_and_config(ckpt: Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        assert (ckpt / name).is_file(), name
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
    assert config["image_token_index"] == IMAGE_ID
    assert config["image_seq_length"] == 256
    assert config["vision_feature_layer"] == -2
    assert config["vision_feature_select_strategy"] == "default"
    text = config["text_config"]
    assert text["num_key_value_heads"] < text["num_attention_heads"]  # GQA
    assert (text["bos_token_id"], text["eos_token_id"], text["pad_token_id"]) == (1, 2, 3)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 3)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    assert len(tokenizer) == text["vocab_size"]


def test_greedy_generation_is_varied(ckpt: Path) -> None:
    model, info = LlavaForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    image_processor = AutoImageProcessor.from_pretrained(ckpt)
    assert type(image_processor).__name__ == "CLIPImageProcessorPil"
    prompt = tokenizer.apply_chat_template(_messages(), add_generation_prompt=True, tokenize=False)
    expanded = prompt.replace("<image>", "<image>" * 256)
    enc = tokenizer(expanded, return_tensors="pt")
    assert int((enc.input_ids == IMAGE_ID).sum()) == 256
    pixel_values = image_processor(_image(), return_tensors="pt").pixel_values
    assert pixel_values.shape == (1, 3, 64, 64)
    out = model.generate(
        input_ids=enc.input_ids,
        attention_mask=enc.attention_mask,
        pixel_values=pixel_values,
        max_new_tokens=32,
        do_sample=False,
    )
    new_tokens = out[0, enc.input_ids.shape[1] :].tolist()
    assert len(new_tokens) == 32
    assert len(set(new_tokens)) >= 4, new_tokens

    # The saved LlavaProcessor expands the placeholder identically.
    processor = AutoProcessor.from_pretrained(ckpt)
    proc = processor(images=_image(), text=prompt, return_tensors="pt")
    assert torch.equal(proc.input_ids, enc.input_ids)
    assert torch.allclose(proc.pixel_values, pixel_values)


def test_build_is_deterministic(ckpt: Path, tmp_path: Path) -> None:
    other = build_preset(PRESET, tmp_path / "again")
    assert _sha256(other / "model.safetensors") == _sha256(ckpt / "model.safetensors")
    for path in ckpt.iterdir():
        assert _sha256(other / path.name) == _sha256(path), path.name


def test_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    build_model(PRESET)
    assert torch.equal(torch.rand(4), expected)


def test_special_tokens_and_bos(ckpt: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    for token, idx in SPECIAL_TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(token) == idx
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (3, 0)
    for text in ("USER: <image>\nWhat", "a<image>b", "<image><image>"):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert ids.count(IMAGE_ID) == text.count("<image>"), (text, ids)
    ids = tokenizer("USER: <image>\nWhat is this? ASSISTANT:").input_ids
    assert ids[0] == 1 and ids.count(1) == 1  # bos added exactly once by tokenizer(...)
    assert tokenizer("hello", add_special_tokens=False).input_ids[0] != 1
    text = "The red circle is on the table."
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_chat_template(ckpt: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    render = tokenizer.apply_chat_template
    assert render(_messages(), add_generation_prompt=True, tokenize=False) == (
        "USER: <image>\nWhat is in this image? ASSISTANT:"
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "image"},
                {"type": "text", "text": "these."},
            ],
        },
        {"role": "assistant", "content": "A cat and a dog."},
        {"role": "user", "content": "Which is bigger?"},
    ]
    assert render(messages, add_generation_prompt=True, tokenize=False) == (
        "Be brief. USER: <image>\n<image>\nCompare these. ASSISTANT: A cat and a dog.</s>"
        "USER: Which is bigger? ASSISTANT:"
    )
    assert render(messages[:3], tokenize=False).endswith("ASSISTANT: A cat and a dog.</s>")


def test_param_counts() -> None:
    assert 500_000 <= count_parameters("tiny-llava") <= 2_000_000
    assert 13_000_000 <= count_parameters("tiny-llava-small") <= 17_000_000
    assert 500_000 <= count_parameters("tiny-gemma3") <= 2_000_000
    assert 13_000_000 <= count_parameters("tiny-gemma3-small") <= 17_000_000


def test_unknown_names_raise() -> None:
    with pytest.raises(ValueError, match="no-such-model") as exc:
        resolve_model_path("no-such-model")
    assert "tiny-llava" in str(exc.value)
    with pytest.raises(ValueError, match="bogus"):
        build_preset("bogus", "/nonexistent/never-created")


def test_resolve_builds_once_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMSERVE_CACHE_DIR", str(tmp_path))
    first = resolve_model_path(PRESET)
    assert first == tmp_path / "models" / f"{PRESET}-v{BUILD_VERSION}"
    assert (first / "config.json").is_file()
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left

    def fail(*args: object) -> None:
        raise AssertionError("rebuilt a cached preset")

    monkeypatch.setattr(tiny_cache, "build_preset", fail)
    start = time.perf_counter()
    assert resolve_model_path(PRESET) == first
    assert time.perf_counter() - start < 0.5
    # An existing checkpoint directory resolves to itself.
    assert resolve_model_path(str(first)) == first.resolve()


def test_resolve_tolerates_concurrent_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MMSERVE_CACHE_DIR", str(tmp_path))
    target = tmp_path / "models" / f"{PRESET}-v{BUILD_VERSION}"

    def racing_build(name: str, out_dir: Path) -> Path:
        target.mkdir(parents=True)  # another process wins the race meanwhile
        (target / "config.json").write_text("{}")
        Path(out_dir, "config.json").write_text('{"ours": true}')
        return Path(out_dir)

    monkeypatch.setattr(tiny_cache, "build_preset", racing_build)
    assert resolve_model_path(PRESET) == target
    assert (target / "config.json").read_text() == "{}"
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_public_api() -> None:
    assert PRESET_NAMES == (
        "tiny-llava",
        "tiny-llava-small",
        "tiny-qwen2-vl",
        "tiny-qwen2-vl-small",
        "tiny-qwen2.5-vl",
        "tiny-qwen2.5-vl-small",
        "tiny-qwen3-vl",
        "tiny-qwen3-vl-small",
        "tiny-llava-onevision",
        "tiny-llava-onevision-small",
        "tiny-llava-next",
        "tiny-llava-next-small",
        "tiny-gemma3",
        "tiny-gemma3-small",
        "tiny-smolvlm",
    )
    assert set(tiny.__all__) >= {"PRESET_NAMES", "build_preset", "resolve_model_path"}
