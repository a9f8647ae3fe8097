"""Qwen3-VL vision transformer: transformers' ``Qwen3VLVisionModel`` with transformers'
parameter names (checkpoints load unchanged).

It is Qwen2-VL's tower (``qwen2_vl_vision``: matmul patch embedding, 2-D rotary, varlen SDPA per
image without a mask) with a patch-embedding bias, learned position embeddings
(``pos_embed``: a square table bilinearly resampled to each image's patch grid, with
transformers' own index/weight helper), a ``linear_fc1`` / ``linear_fc2`` MLP and, for
DeepStack, one extra patch merger per ``deepstack_visual_indexes`` layer (LayerNorm after the
merge-size x merge-size shuffle) applied to that layer's output.

``forward`` returns one row per merged patch: the final merger's output followed by each
DeepStack merger's, concatenated on the feature dimension ([n, out_hidden * (1 + k)]), so an
image's encoder-cache entry carries its DeepStack features and any slice of its rows carries
exactly those tokens' features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.vision_utils import get_vision_interpolation_indices_and_weights

from mmserve.layers.linear import Linear
from mmserve.models.vision.qwen2_vl import (
    Grid,
    PatchEmbed,
    VisionAttention,
    VisionRotaryEmbedding,
    _equal_runs,
)


class BiasedPatchEmbed(PatchEmbed):
    """Qwen2-VL's matmul patch embedding with the Conv3d's bias."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, config.hidden_size)
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, self.embed_dim, kernel, kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.linear(patches, self.proj.weight.view(self.embed_dim, -1), self.proj.bias)


class Qwen3VisionMLP(nn.Module):
    """linear_fc1 -> activation -> linear_fc2."""

    def __init__(self, dim: int, hidden_dim: int, hidden_act: str) -> None:
        super().__init__()
        self.linear_fc1 = Linear(dim, hidden_dim)
        self.act = ACT2FN[hidden_act]
        self.linear_fc2 = Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class Qwen3VisionBlock(nn.Module):
    """Pre-norm block: LayerNorm, attention over the given segments, LayerNorm, MLP."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        dim = config.hidden_size
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, config.num_heads)
        self.mlp = Qwen3VisionMLP(dim, config.intermediate_size, config.hidden_act)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        segments: list[tuple[int, int]],
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class Qwen3PatchMerger(nn.Module):
    """Merges each merge_size x merge_size block of patches into one row of ``out_hidden_size``;
    ``postshuffle`` (the DeepStack mergers) normalizes the merged row instead of each patch."""

    def __init__(self, config: Any, postshuffle: bool) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size * config.spatial_merge_size**2
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.hidden_size if postshuffle else config.hidden_size, eps=1e-6)
        self.linear_fc1 = Linear(self.hidden_size, self.hidden_size)
        self.act_fn = nn.GELU()
        self.linear_fc2 = Linear(self.hidden_size, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle:
            x = self.norm(x.view(-1, self.hidden_size))
        else:
            x = self.norm(x).view(-1, self.hidden_size)
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class Qwen3VisionTransformer(nn.Module):
    """``forward(patches, grids)``: transformers' ``Qwen3VLVisionModel(patches, grid_thw)``'s
    ``pooler_output`` and ``deepstack_features``, concatenated per row (see the module)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.merge_size = config.spatial_merge_size
        dim = config.hidden_size
        theta = float((config.rope_parameters or {}).get("rope_theta", 10000.0))
        self.rotary = VisionRotaryEmbedding(dim // config.num_heads, theta, self.merge_size)
        self.patch_embed = BiasedPatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, dim)
        self.grid_side = int(config.num_position_embeddings**0.5)
        self.blocks = nn.ModuleList(Qwen3VisionBlock(config) for _ in range(config.depth))
        self.merger = Qwen3PatchMerger(config, postshuffle=False)
        self.deepstack_visual_indexes = [int(i) for i in config.deepstack_visual_indexes]
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3PatchMerger(config, postshuffle=True) for _ in self.deepstack_visual_indexes
        )

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        x = self.patch_embed(patches) + self._position_embeddings(grids, patches.device)
        cos, sin = self.rotary(grids, x.device)
        segments = _equal_runs([h * w for t, h, w in grids for _ in range(t)])
        features: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, segments)
            if i in self.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)]
                features.append(merger(x))
        return torch.cat([self.merger(x), *features], dim=1)

    def _position_embeddings(self, grids: Sequence[Grid], device: torch.device) -> torch.Tensor:
        """The learned table resampled (bilinear, corners aligned) to each patch, in the
        processor's merge-block-major patch order: [patches, hidden]."""
        indices, weights = get_vision_interpolation_indices_and_weights(
            torch.tensor(grids, device=device),
            num_grid_per_side=self.grid_side,
            mode="bilinear",
            align_corners=True,
            spatial_merge_size=self.merge_size,
        )
        return (self.pos_embed(indices) * weights[:, :, None]).sum(1)
