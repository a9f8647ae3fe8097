"""The SmolVLM-256M/500M-Instruct shape presets: the published numbers, the hub's processor and
template files, and a cut build (1 text and 1 vision layer, the real tile size and vocabulary)
that mmserve answers like transformers (float32 greedy) with an image split into the published
4 x 3 tiles plus the global image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmserve.models.tiny.shapes import build_spec, get_shape
from mmserve.models.tiny.shapes.spec import GB
from tests.support.images import make_image

SMOLVLM_256M = "shape:SmolVLM-256M-Instruct"
CUT = {"text_config": {"num_hidden_layers": 1}, "vision_config": {"num_hidden_layers": 1}}


def test_published_sizes() -> None:
    small, large = get_shape(SMOLVLM_256M), get_shape("shape:SmolVLM-500M-Instruct")
    assert small.hub_repo == "HuggingFaceTB/SmolVLM-256M-Instruct"
    assert large.hub_repo == "HuggingFaceTB/SmolVLM-500M-Instruct"
    for spec, (width, layers, heads, kv_heads) in ((small, (576, 30, 9, 3)),
                                                   (large, (960, 32, 15, 5))):  # fmt: skip
        text, vision = spec.config["text_config"], spec.config["vision_config"]
        assert (text["hidden_size"], text["num_hidden_layers"]) == (width, layers)
        assert (text["num_attention_heads"], text["num_key_value_heads"]) == (heads, kv_heads)
        assert (vision["hidden_size"], vision["image_size"], vision["patch_size"]) == (768, 512, 16)
        assert spec.config["scale_factor"] == 4 and spec.config["image_token_id"] == 49190
        assert spec.tokens.size == 49280 and spec.dtype == "bfloat16"
        assert not spec.config["tie_word_embeddings"]


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = get_shape(SMOLVLM_256M).resized(CUT, max_shard_bytes=5 * GB)
    return build_spec(spec, tmp_path_factory.mktemp("shape") / "smolvlm-256m-cut")


def test_hub_files(cut: Path) -> None:
    assert sorted(f.name for f in cut.glob("*.safetensors")) == ["model.safetensors"]
    assert not (cut / "chat_template.jinja").exists()
    template = json.loads((cut / "chat_template.json").read_text())["chat_template"]
    assert json.loads((cut / "tokenizer_config.json").read_text())["chat_template"] == template
    pre = json.loads((cut / "preprocessor_config.json").read_text())
    assert pre["size"] == {"longest_edge": 2048}
    assert pre["max_image_size"] == {"longest_edge": 512}
    assert json.loads((cut / "processor_config.json").read_text())["image_seq_len"] == 64
    generation = json.loads((cut / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 49279


def test_cut_answers_like_transformers_with_published_tiles(cut: Path) -> None:
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    from mmserve import LLM, SamplingParams

    image = make_image(7, (1000, 700))  # -> 2048 x 1434 -> 4 x 3 tiles of 512 + the global
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    processor = AutoProcessor.from_pretrained(cut)
    prompt = processor.apply_chat_template(chat, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[image], return_tensors="pt")
    assert inputs["pixel_values"].shape[1:] == (13, 3, 512, 512)
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(49190) == 13 * 64 and ids[-1] != 49190
    model = Idefics3ForConditionalGeneration.from_pretrained(cut, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    expected = out[0, len(ids) :].tolist()
    del model
    llm = LLM(model=str(cut), dtype="float32", kv_cache_memory=64 << 20, max_model_len=2048)
    messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": "What?"}]}]  # fmt: skip
    result = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert result.prompt_token_ids == ids
    assert result.outputs[0].token_ids == expected
