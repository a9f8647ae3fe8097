"""Gemma 3's layers as modules: the RoPE tables live on the model's device (no copy per step)
and, after engine loading, equal transformers' per layer type."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

from mmserve.engine.setup.loading import build_model_config, load_model
from mmserve.models.gemma3 import Gemma3ForConditionalGeneration
from mmserve.models.gemma3_text import FULL, SLIDING
from mmserve.models.tiny import resolve_model_path

MODEL = "tiny-gemma3"


class CrossDeviceOps(TorchDispatchMode):
    """Records every op whose output lies on another device than one of its tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        devices = {a.device for a in args if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and devices - {out.device}:
            self.ops.append(str(func))
        return out


def plain_tensor_attributes(model: nn.Module) -> list[str]:
    """Tensors held as plain attributes: ``Module.to`` leaves them where they are."""
    return [
        f"{name}.{attr}"
        for name, module in model.named_modules()
        for attr, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    ]


def test_every_tensor_moves_with_the_model() -> None:
    config: Any = AutoConfig.from_pretrained(resolve_model_path(MODEL))
    assert plain_tensor_attributes(Gemma3ForConditionalGeneration(config)) == []


def test_rope_tables_copy_nothing_across_devices() -> None:
    config: Any = AutoConfig.from_pretrained(resolve_model_path(MODEL))
    text = Gemma3ForConditionalGeneration(config).language_model.to("meta")
    positions = torch.arange(12, device="meta")
    with CrossDeviceOps() as mode:
        tables = text.rope_tables(positions, torch.float32)
    assert mode.ops == []
    assert {t.device.type for pair in tables.values() for t in pair} == {"meta"}


def test_loaded_rope_frequencies_match_transformers_per_layer_type() -> None:
    """The global layers' linear scaling survives building on the meta device and loading."""
    model_config = build_model_config(MODEL)
    model: Any = load_model(model_config, torch.device("cpu"))
    hf = Gemma3RotaryEmbedding(model_config.hf_config.text_config)
    text = model.language_model
    for kind, rotary in ((FULL, text.rotary_emb), (SLIDING, text.local_rotary_emb)):
        assert rotary.inv_freq.dtype == torch.float32
        assert torch.equal(rotary.inv_freq, getattr(hf, f"{kind}_inv_freq")), kind
    assert not torch.equal(text.rotary_emb.inv_freq, text.local_rotary_emb.inv_freq)
