"""mmserve's vision towers vs transformers' (float32), and loading checkpoints into them.

Tolerances: the CLIP tower runs the same ops as transformers' and must match exactly
(``torch.equal``); Qwen2-VL's runs its patch embedding as a matmul instead of a Conv3d (another
summation order), so it must match within ``allclose(rtol=1e-4, atol=1e-4)`` on embeddings of
magnitude ~10 (the measured difference is ~1e-5).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlavaForConditionalGeneration as HFLlava
from transformers import Qwen2VLForConditionalGeneration as HFQwen2VL
from transformers.activations import ACT2FN

from mmserve.kernels import cpu_ops, unavailable_reason
from mmserve.models.llava import LlavaForConditionalGeneration
from mmserve.models.qwen2_vl import Qwen2VLForConditionalGeneration
from mmserve.models.tiny.presets import PRESETS, PresetSpec, randomize_weights
from mmserve.models.vision.clip import layers_to_run, quick_gelu_
from mmserve.models.vision.qwen2_vl import PatchEmbed, _equal_runs, rotate_heads

QWEN_TOL = {"rtol": 1e-4, "atol": 1e-4}
CLIP_LAYERS = 3


# ---- CLIP (LLaVA) ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llava_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, HFLlava]:
    """A tiny LLaVA with a 3-layer CLIP, saved by transformers (all layers + post_layernorm)."""
    base = PRESETS["tiny-llava"]
    assert isinstance(base, PresetSpec)
    spec = dataclasses.replace(base, vision_layers=CLIP_LAYERS)
    torch.manual_seed(0)
    model = HFLlava(spec.make_config()).eval()
    randomize_weights(model)
    out = tmp_path_factory.mktemp("llava")
    model.save_pretrained(out)
    return out, model


def mmserve_llava(hf: HFLlava, ckpt: Path, layer: int, strategy: str):
    config = copy.deepcopy(hf.config)
    config.vision_feature_layer, config.vision_feature_select_strategy = layer, strategy
    model = LlavaForConditionalGeneration(config).eval()
    model.load_weights(ckpt)
    return model


@pytest.mark.parametrize("strategy", ["default", "full"])
@pytest.mark.parametrize("layer", [-1, -2, -3, -4, 0, 1, 2, 3])
def test_clip_stops_at_feature_layer_and_matches_transformers(llava_ckpt, layer, strategy):
    ckpt, hf = llava_ckpt
    model = mmserve_llava(hf, ckpt, layer, strategy)
    built = len(model.vision_tower.encoder.layers)
    assert built == (layer if layer >= 0 else CLIP_LAYERS + 1 + layer)
    assert not hasattr(model.vision_tower, "post_layernorm")
    pixels = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        mine = model.encode_images(list(pixels.numpy()))
        # transformers' LlavaModel.get_image_features, minus its decorators (which capture no
        # hidden states when vision_feature_layer is 0)
        hidden = hf.model.vision_tower(pixels, output_hidden_states=True).hidden_states[layer]
        ref = hf.model.multi_modal_projector(hidden[:, 1:] if strategy == "default" else hidden)
    assert len(mine) == 3
    for a, b in zip(mine, ref, strict=True):
        assert a.shape == b.shape == (256 + (strategy == "full"), hf.config.text_config.hidden_size)
        assert torch.equal(a, b)


@pytest.mark.parametrize("layer", [CLIP_LAYERS + 1, -CLIP_LAYERS - 2])
def test_clip_feature_layer_out_of_range_is_rejected(layer):
    with pytest.raises(ValueError, match="out of range"):
        layers_to_run(CLIP_LAYERS, layer)


def edited_checkpoint(src: Path, dst: Path, edit) -> Path:
    """A copy of ``src`` whose weights dict went through ``edit``."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(dst / "model.safetensors"))
    edit(weights)
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


LAYER0 = "vision_tower.encoder.layers.0."
BAD_CHECKPOINTS = {  # id: (key, tensor to store under it or None to delete it, error regex)
    "layer-beyond-depth": (
        "vision_tower.encoder.layers.7.mlp.fc1.bias",
        torch.zeros(64),
        r"unexpected keys \['vision_tower.encoder.layers.7.mlp.fc1.bias'\]",
    ),
    "garbage-norm-key": (
        "vision_tower.post_layernorm.gamma",
        torch.zeros(32),
        r"unexpected keys \['vision_tower.post_layernorm.gamma'\]",
    ),
    "missing-stacked-shard": (
        LAYER0 + "self_attn.k_proj.bias",
        None,
        r"missing keys \['vision_tower.encoder.layers.0.self_attn.k_proj.bias'\]",
    ),
    "missing-key": (
        "vision_tower.pre_layrnorm.weight",
        None,
        r"missing keys \['vision_tower.pre_layrnorm.weight'\]",
    ),
    "bad-shard-shape": (
        LAYER0 + "self_attn.v_proj.weight",
        torch.zeros(32, 31),
        r"v_proj.weight' has shape \(32, 31\)",
    ),
}


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_checkpoint_mismatch_fails_loudly(llava_ckpt, tmp_path, case):
    ckpt, hf = llava_ckpt
    key, tensor, message = BAD_CHECKPOINTS[case]

    def edit(weights):
        if tensor is None:
            del weights[key]
        else:
            weights[key] = tensor

    bad = edited_checkpoint(ckpt, tmp_path / "bad", edit)
    model = LlavaForConditionalGeneration(hf.config)
    with pytest.raises(ValueError, match=message):
        model.load_weights(bad)


def test_checkpoint_without_the_dropped_layers_loads(llava_ckpt, tmp_path):
    """The skipped weights are optional: a checkpoint cut at the feature layer loads too."""
    ckpt, hf = llava_ckpt
    last = f"vision_tower.encoder.layers.{CLIP_LAYERS - 1}."

    def cut(weights):
        for key in [k for k in weights if k.startswith(last) or "post_layernorm" in k]:
            del weights[key]

    LlavaForConditionalGeneration(hf.config).load_weights(
        edited_checkpoint(ckpt, tmp_path / "c", cut)
    )


# ---- Qwen2-VL ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen(qwen_tower_pair):
    return qwen_tower_pair("tiny-qwen2-vl", Qwen2VLForConditionalGeneration, HFQwen2VL)


def hf_visual(hf: HFQwen2VL, items: list[dict]) -> list[torch.Tensor]:
    pixels = torch.cat([torch.as_tensor(d["pixel_values"]) for d in items])
    grid = torch.tensor([list(d["image_grid_thw"]) for d in items])
    merge = hf.config.vision_config.spatial_merge_size
    out = hf.model.visual(pixels, grid_thw=grid).pooler_output
    return list(out.split((grid.prod(-1) // merge**2).tolist()))


@pytest.mark.parametrize(
    "sizes",
    [
        [(224, 224)],
        [(1280, 720)],
        [(320, 480), (30, 20), (640, 360)],
        [(224, 224), (96, 80), (224, 224), (300, 120), (96, 80)],  # equal sizes apart
    ],
    ids=["one", "one-hd", "three-sizes", "repeated-sizes"],
)
def test_qwen2_vl_tower_matches_transformers(qwen, sizes):
    model, hf, prepare = qwen
    items = [prepare(size, seed) for seed, size in enumerate(sizes)]
    with torch.inference_mode():
        mine, ref = model.encode_images(items), hf_visual(hf, items)
    for a, b in zip(mine, ref, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, **QWEN_TOL), (a - b).abs().max()


def test_qwen2_vl_images_attend_only_within_themselves(qwen):
    model, _, prepare = qwen
    items = [prepare((224, 224), 0), prepare((300, 120), 1), prepare((224, 224), 2)]
    with torch.inference_mode():
        together = model.encode_images(items)
        alone = [model.encode_images([item])[0] for item in items]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(a, b, **QWEN_TOL)


def test_qwen2_vl_video_frames_attend_per_frame(qwen):
    """A grid with t > 1 (two frames): each frame is its own attention segment, as in
    transformers."""
    model, hf, _ = qwen
    vision = hf.config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = np.random.default_rng(0).standard_normal((2 * 4 * 6, width), dtype=np.float32)
    item = {"pixel_values": pixels, "image_grid_thw": (2, 4, 6)}
    with torch.inference_mode():
        (mine,), (ref,) = model.encode_images([item]), hf_visual(hf, [item])
    assert torch.allclose(mine, ref, **QWEN_TOL)


def test_patch_embed_matmul_equals_conv3d(qwen):
    vision = qwen[1].config.vision_config
    embed = PatchEmbed(vision)
    torch.nn.init.normal_(embed.proj.weight)
    patches = torch.randn(
        50, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    )
    kernel = (vision.temporal_patch_size, vision.patch_size, vision.patch_size)
    with torch.no_grad():
        conv = embed.proj(patches.view(-1, vision.in_channels, *kernel)).view(50, -1)
        assert torch.allclose(embed(patches), conv, rtol=1e-5, atol=1e-4)  # |values| ~50


def test_quick_gelu_is_bit_identical_to_transformers():
    x = torch.randn(300, 77, generator=torch.Generator().manual_seed(0)) * 4
    assert torch.equal(quick_gelu_(x.clone()), ACT2FN["quick_gelu"](x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_vision_rope_is_bit_identical_to_transformers(dtype):
    """The towers' RoPE on the fused qkv's q and k heads (a strided view), in the CPU kernel:
    transformers' ``apply_rotary_pos_emb_vision`` bit for bit in every dtype."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

    assert cpu_ops() is not None, unavailable_reason()  # CI builds the kernels: they run here
    gen = torch.Generator().manual_seed(1)
    n, heads, hd = 37, 4, 80
    qkv = (torch.randn(n, 3, heads, hd, generator=gen) * 3).to(dtype)
    angles = torch.rand(n, hd // 2, generator=gen) * 60
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    with torch.inference_mode():
        # the tables as VisionRotaryEmbedding makes them: [n, 1, hd] and [n, 1, hd / 2]
        qk = rotate_heads(qkv[:, :2].reshape(n, 2 * heads, hd), cos[:, None], angles.sin()[:, None])
        q, k = apply_rotary_pos_emb_vision(qkv[:, 0], qkv[:, 1], cos, sin)
    assert qk.dtype == dtype
    assert torch.equal(qk[:, :heads], q) and torch.equal(qk[:, heads:], k)


def test_equal_runs():
    assert _equal_runs([3, 3, 5, 3]) == [(2, 3), (1, 5), (1, 3)]
    assert _equal_runs([7]) == [(1, 7)]
    assert _equal_runs([]) == []
