"""mmserve's SigLIP tower vs transformers' ``SiglipVisionModel`` (float32), loaded from a
checkpoint transformers saved (with the pooling head, every layer and ``post_layernorm``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import SiglipVisionConfig, SiglipVisionModel

from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.tiny.presets import randomize_weights
from mmserve.models.vision.siglip import SiglipVisionTower

LAYERS = 3
RENAME = [(r"^vision_model\.", "")]


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SiglipVisionModel]:
    config = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        vision_use_head=True,
    )
    torch.manual_seed(0)
    model = SiglipVisionModel(config).eval()
    randomize_weights(model)
    out = tmp_path_factory.mktemp("siglip")
    model.save_pretrained(out)
    return out, model


def load_tower(ckpt: Path, config, layer: int, post_layernorm: bool) -> SiglipVisionTower:
    tower = SiglipVisionTower(config, layer, post_layernorm).eval()
    load_safetensors(tower, ckpt, RENAME, skip=tower.skipped_weights(""))
    return tower


@pytest.mark.parametrize("layer", [-1, -2, -4, 0, 1, 3])
def test_hidden_state_of_feature_layer_matches_transformers(siglip, layer):
    ckpt, hf = siglip
    tower = load_tower(ckpt, hf.config, layer, post_layernorm=False)
    assert len(tower.encoder.layers) == (layer if layer >= 0 else LAYERS + 1 + layer)
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        mine = tower(pixels)
        ref = hf(pixels, output_hidden_states=True).hidden_states[layer]
    assert mine.shape == ref.shape == (3, 16, 32)
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


def test_post_layernorm_gives_last_hidden_state(siglip):
    """Gemma 3's use: the last layer, then ``post_layernorm``; the head is never built."""
    ckpt, hf = siglip
    tower = load_tower(ckpt, hf.config, -1, post_layernorm=True)
    assert not hasattr(tower, "head")
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        mine, ref = tower(pixels), hf(pixels).last_hidden_state
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
    # without the post-norm the output differs: the flag is what applies it
    with torch.inference_mode():
        plain = load_tower(ckpt, hf.config, -1, post_layernorm=False)(pixels)
    assert not torch.allclose(plain, ref, atol=1e-3)


def test_unknown_key_still_fails_the_load(siglip, tmp_path):
    """Skipping the head and later layers is by name: any other unknown key is an error."""
    ckpt, hf = siglip
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["head.extra"] = torch.zeros(1)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected keys \[.*head\.extra"):
        load_tower(tmp_path, hf.config, -2, post_layernorm=False)


def test_wrong_image_size_is_rejected(siglip):
    ckpt, hf = siglip
    tower = load_tower(ckpt, hf.config, -1, post_layernorm=False)
    with pytest.raises(ValueError, match="vision tower takes 32x32"):
        tower(torch.zeros(1, 3, 48, 48))
