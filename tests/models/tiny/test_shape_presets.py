"""Real-size shape presets (mmserve.models.tiny.shapes): published configs, random weights.

The default run builds no whole shape (gigabytes): it counts parameters on the meta device,
checks each tokenizer's special ids against its config, and builds shrunk copies (fewer
layers, small shards) to check the hub layout, shards and index and that transformers and
mmserve both load them. ``MMSERVE_SHAPE_TESTS=1`` also builds the smallest shapes whole
(SmolVLM-256M, 0.5 GB; LLaVA-OneVision-0.5B, 1.8 GB) and chats with them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from mmserve.models.tiny import resolve_model_path
from mmserve.models.tiny.shapes import (
    SHAPE_NAMES,
    build_spec,
    count_shape_parameters,
    get_shape,
    tensor_plans,
)
from mmserve.models.tiny.shapes.spec import GB
from mmserve.models.tiny.shapes.tokens import build_shape_tokenizer
from mmserve.models.tiny.shapes.weights import TensorPlan, tensor_chunks, write_checkpoint

ONEVISION = "shape:llava-onevision-qwen2-0.5b-ov-hf"
SMOLVLM_256M = "shape:SmolVLM-256M-Instruct"
SMOLVLM_500M = "shape:SmolVLM-500M-Instruct"
# image placeholder and eos ids per shape, from the published configs
IMAGE_TOKEN = {
    SMOLVLM_256M: ("<image>", 49190),
    SMOLVLM_500M: ("<image>", 49190),
    "shape:Qwen2-VL-2B-Instruct": ("<|image_pad|>", 151655),
    "shape:Qwen2.5-VL-3B-Instruct": ("<|image_pad|>", 151655),
    ONEVISION: ("<image>", 151646),
    "shape:gemma-3-4b-it": ("<image_soft_token>", 262144),
    "shape:llava-1.5-7b-hf": ("<image>", 32000),
}


def test_names() -> None:
    assert SHAPE_NAMES == (
        SMOLVLM_256M,
        SMOLVLM_500M,
        ONEVISION,
        "shape:Qwen2-VL-2B-Instruct",
        "shape:Qwen2.5-VL-3B-Instruct",
        "shape:gemma-3-4b-it",
        "shape:llava-1.5-7b-hf",
    )


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_parameter_count_is_published(name: str) -> None:
    spec = get_shape(name)
    count = count_shape_parameters(name)
    assert abs(count - spec.published_params) <= 0.001 * spec.published_params, count


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_plans_cover_every_parameter_once_in_published_dtype(name: str) -> None:
    spec = get_shape(name)
    plans = tensor_plans(spec)
    assert len({p.name for p in plans}) == len(plans)
    assert sum(p.nbytes for p in plans) == count_shape_parameters(name) * 2
    assert {p.dtype for p in plans} == {getattr(torch, spec.dtype)}
    assert not any(p.name.startswith("model.language_model.") for p in plans)  # hub names


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_tokenizer_has_published_length_and_special_ids(name: str) -> None:
    spec = get_shape(name)
    tokenizer = build_shape_tokenizer(spec.tokens)
    assert len(tokenizer) == spec.tokens.size
    for token, token_id in spec.tokens.specials.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    image, image_id = IMAGE_TOKEN[name]
    assert spec.tokens.specials[image] == image_id
    config = spec.config
    assert image_id in (config.get("image_token_id"), config.get("image_token_index"))
    assert tokenizer.convert_tokens_to_ids(spec.tokens.eos) in (
        [spec.generation_config["eos_token_id"]]
        if isinstance(spec.generation_config["eos_token_id"], int)
        else spec.generation_config["eos_token_id"]
    )
    ids = tokenizer("a cat and a dog " + image, add_special_tokens=False)["input_ids"]
    assert ids[-1] == image_id and all(i < spec.tokens.size for i in ids)


def test_chunks_are_deterministic_and_safetensors_reads_the_files(tmp_path: Path) -> None:
    plans = [
        TensorPlan("a.weight", (3000, 700), torch.bfloat16, "normal"),
        TensorPlan("norm.weight", (700,), torch.bfloat16, "ones"),
        TensorPlan("b.bias", (5,), torch.float16, "small"),
    ]
    first = torch.cat(list(tensor_chunks(plans[0])))
    assert torch.equal(first, torch.cat(list(tensor_chunks(plans[0]))))
    assert 0.015 < first.float().std().item() < 0.025
    files = write_checkpoint(tmp_path, plans, max_shard_bytes=2 * 3000 * 700)
    assert [f.name for f in files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(p.nbytes for p in plans)
    assert index["weight_map"] == {
        "a.weight": files[0].name,
        "b.bias": files[1].name,
        "norm.weight": files[1].name,
    }
    with safe_open(str(files[0]), framework="pt") as f:
        assert torch.equal(f.get_tensor("a.weight").flatten(), first)
    with safe_open(str(files[1]), framework="pt") as f:
        assert torch.equal(f.get_tensor("norm.weight"), torch.ones(700, dtype=torch.bfloat16))
        assert f.get_tensor("b.bias").dtype == torch.float16


def test_a_shard_has_the_bytes_safetensors_save_file_writes(tmp_path: Path) -> None:
    """The hub's files come from ``safetensors.save_file``: tensors ordered by dtype (widest
    first), then by name, whatever order the model lists them in. The order decides which
    tensors lie back to back in a file (the loader maps a stacked gate/up weight only when its
    parts do), so a shape preset must order them as the hub does."""
    from safetensors.torch import save_file

    from mmserve.models.tiny.shapes.weights import write_safetensors

    plans = [  # model order: q, k, v, o, then the MLP, a float32 norm last
        TensorPlan("layers.10.self_attn.q_proj.weight", (8, 4), torch.bfloat16, "normal"),
        TensorPlan("layers.10.self_attn.k_proj.weight", (4, 4), torch.bfloat16, "normal"),
        TensorPlan("layers.10.self_attn.v_proj.weight", (4, 4), torch.bfloat16, "normal"),
        TensorPlan("layers.10.self_attn.o_proj.weight", (4, 8), torch.bfloat16, "normal"),
        TensorPlan("layers.2.mlp.gate_proj.weight", (6, 4), torch.bfloat16, "normal"),
        TensorPlan("layers.2.mlp.up_proj.weight", (6, 4), torch.bfloat16, "normal"),
        TensorPlan("layers.2.mlp.down_proj.weight", (4, 6), torch.bfloat16, "normal"),
        TensorPlan("layers.2.bias", (3,), torch.float16, "small"),
        TensorPlan("norm.weight", (4,), torch.float32, "ones"),
    ]
    write_safetensors(tmp_path / "ours.safetensors", plans)
    tensors = {p.name: torch.cat(list(tensor_chunks(p))).view(p.shape) for p in plans}
    save_file(tensors, str(tmp_path / "hub.safetensors"), metadata={"format": "pt"})
    ours = (tmp_path / "ours.safetensors").read_bytes()
    assert ours == (tmp_path / "hub.safetensors").read_bytes()


CUTS = {
    SMOLVLM_500M: {
        "text_config": {"num_hidden_layers": 2},
        "vision_config": {"num_hidden_layers": 1},
    },
    ONEVISION: {"text_config": {"num_hidden_layers": 2}, "vision_config": {"num_hidden_layers": 2}},
    "shape:Qwen2-VL-2B-Instruct": {"num_hidden_layers": 2, "vision_config": {"depth": 2}},
    "shape:gemma-3-4b-it": {
        "text_config": {"num_hidden_layers": 2},
        "vision_config": {"num_hidden_layers": 2},
    },
    "shape:llava-1.5-7b-hf": {
        "text_config": {"num_hidden_layers": 1},
        "vision_config": {"num_hidden_layers": 2},
    },
}


@pytest.mark.parametrize("name", list(CUTS))
def test_shrunk_build_loads_in_transformers_and_mmserve(name: str, tmp_path: Path) -> None:
    spec = get_shape(name).resized(CUTS[name], max_shard_bytes=GB // 4)
    out = build_spec(spec, tmp_path / "ckpt")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(f.name for f in out.glob("*.safetensors"))
    assert len(shards) >= 2 and sorted(set(index["weight_map"].values())) == shards
    for shard in out.glob("*.safetensors"):
        assert shard.stat().st_size <= GB // 4 + 10**6 or _single_tensor(shard)
    assert json.loads((out / "config.json").read_text()) == spec.config
    model_cls = getattr(transformers, spec.model_class)
    model, info = model_cls.from_pretrained(out, output_loading_info=True, dtype=torch.bfloat16)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    del model
    from mmserve.engine.setup.loading import build_model_config, load_model

    config = build_model_config(str(out), dtype="bfloat16", max_model_len=2048)
    mm_model = load_model(config, torch.device("cpu"))
    head = mm_model.lm_head.weight
    assert head.dtype == torch.bfloat16
    tied = bool(getattr(config.hf_config, "tie_word_embeddings", False))
    assert (head is mm_model.language_model.embed_tokens.weight) == tied


def _single_tensor(path: Path) -> bool:
    with safe_open(str(path), framework="pt") as f:
        return len(list(f.keys())) == 1


@pytest.mark.skipif(
    os.environ.get("MMSERVE_SHAPE_TESTS") != "1",
    reason="builds 0.5 and 1.8 GB; MMSERVE_SHAPE_TESTS=1",
)
@pytest.mark.parametrize("name", [SMOLVLM_256M, ONEVISION])
def test_smallest_shapes_build_whole_and_chat(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmserve import LLM, SamplingParams

    monkeypatch.setenv("MMSERVE_CACHE_DIR", str(tmp_path))
    path = resolve_model_path(name)
    weight_bytes = count_shape_parameters(name) * 2
    assert weight_bytes < (path / "model.safetensors").stat().st_size < weight_bytes + 10**6
    llm = LLM(model=name, dtype="bfloat16", kv_cache_memory=256 << 20, max_model_len=4096)
    chat = [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    out = llm.chat(chat, SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4
