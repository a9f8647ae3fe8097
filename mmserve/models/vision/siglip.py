"""SigLIP vision tower up to a feature layer, with or without the final ``post_layernorm``.

Parameter names follow transformers' ``SiglipVisionModel`` (``embeddings.*``,
``encoder.layers.N.*``, ``post_layernorm``); its encoder layers have CLIP's structure and names,
so they are ``clip_vision``'s (q/k/v as one ``StackedLinear``). Unlike CLIP there is no class
token and no pre-norm, and the patch convolution has a bias. Only the layers up to
``feature_layer`` are built; later layers, the attention-pooling ``head`` and (when not applied)
``post_layernorm`` are named by ``skipped_weights`` so the loader passes over them.

- LLaVA-OneVision reads ``hidden_states[vision_feature_layer]``: no post-norm.
- Gemma 3 reads ``last_hidden_state``: ``feature_layer=-1, post_layernorm=True``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmserve.models.vision.clip import LAYER_WEIGHTS, CLIPEncoder, layers_to_run

# SiglipMultiheadAttentionPoolingHead's parameter names (the pooled output; never read here).
HEAD_WEIGHTS = (
    "probe",
    "attention.in_proj_weight",
    "attention.in_proj_bias",
    "attention.out_proj.weight",
    "attention.out_proj.bias",
    "layernorm.weight",
    "layernorm.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
)


class SiglipVisionEmbeddings(nn.Module):
    """Patch convolution (with bias) + learned position embeddings; no class token."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.image_size, self.patch_size = config.image_size, config.patch_size
        dim = config.hidden_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels, dim, self.patch_size, self.patch_size, padding="valid"
        )
        self.position_embedding = nn.Embedding((self.image_size // self.patch_size) ** 2, dim)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, patches, dim]."""
        _, _, height, width = pixel_values.shape
        if height != self.image_size or width != self.image_size:
            raise ValueError(
                f"image of {height}x{width} pixels, the vision tower takes"
                f" {self.image_size}x{self.image_size}"
            )
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    """``forward(pixels)`` = transformers' ``SiglipVisionModel(pixels, output_hidden_states=True)
    .hidden_states[feature_layer]`` (index 0: the embeddings), then ``post_layernorm`` when
    ``post_layernorm`` is set (with ``feature_layer=-1`` that is ``last_hidden_state``)."""

    def __init__(self, config: Any, feature_layer: int = -1, post_layernorm: bool = False) -> None:
        super().__init__()
        self.config = config
        self.embeddings = SiglipVisionEmbeddings(config)
        num_layers = layers_to_run(config.num_hidden_layers, feature_layer)
        self.encoder = CLIPEncoder(config, num_layers)
        self.post_layernorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if post_layernorm else None
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixel_values.to(self.embeddings.patch_embedding.weight.dtype))
        for layer in self.encoder.layers:
            x = layer(x)
        return x if self.post_layernorm is None else self.post_layernorm(x)

    def skipped_weights(self, prefix: str) -> set[str]:
        """Checkpoint names this tower does not build: the layers after the feature layer, the
        pooling head and, unless applied, ``post_layernorm``."""
        skipped = {f"{prefix}head.{name}" for name in HEAD_WEIGHTS}
        if self.post_layernorm is None:
            skipped |= {f"{prefix}post_layernorm.{kind}" for kind in ("weight", "bias")}
        for i in range(len(self.encoder.layers), self.config.num_hidden_layers):
            skipped.update(f"{prefix}encoder.layers.{i}.{name}" for name in LAYER_WEIGHTS)
        return skipped
