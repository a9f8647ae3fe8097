"""Qwen3-VL's text model: mmserve's Llama decoder with Qwen3's per-head q/k RMSNorm, the
interleaved M-RoPE of ``layers.mrope_interleaved`` and DeepStack.

DeepStack (``DeepstackInputs``): after decoder layer ``i < k`` the i-th DeepStack feature of
each image token is added to that token's hidden state, exactly where transformers'
``Qwen3VLTextModel`` adds it (to the layer's output, residual included). mmserve's layers hand
the residual add to the next layer's norm; at those k layers the sum is materialized instead,
so the additions happen in transformers' order. A forward without image rows runs the plain
Llama loop.
"""

from __future__ import annotations

from typing import Any

import torch

from mmserve.layers.attention import AttentionMetadata, PagedKVCache
from mmserve.layers.mrope_interleaved import InterleavedMRotaryEmbedding
from mmserve.layers.rotary import rope_theta
from mmserve.models.interface import DeepstackInputs
from mmserve.models.llama import Attention, LlamaModel

DEFAULT_MROPE_SECTION = (24, 20, 20)  # transformers' default for Qwen3-VL


class Qwen3Attention(Attention):
    """Llama attention with RMSNorm over each q and k head before RoPE (``q_norm``,
    ``k_norm``)."""

    def __init__(self, cfg: Any, layer_idx: int, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__(cfg, layer_idx, qkv_bias, o_bias, qk_norm_offset=0.0)


class Qwen3VLTextModel(LlamaModel):
    """The decoder of ``Qwen3VLTextModel``; ``forward`` takes optional ``DeepstackInputs``."""

    def __init__(self, cfg: Any) -> None:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        section = (cfg.rope_parameters or {}).get("mrope_section", DEFAULT_MROPE_SECTION)
        rotary = InterleavedMRotaryEmbedding(head_dim, rope_theta(cfg), section)
        super().__init__(cfg, rotary_emb=rotary, attention_cls=Qwen3Attention)
        self.hidden_size = cfg.hidden_size

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
        deepstack: DeepstackInputs | None = None,
    ) -> torch.Tensor:
        if deepstack is None or deepstack.rows.numel() == 0:
            return super().forward(inputs_embeds, positions, cache, meta)
        features = deepstack.features.split(self.hidden_size, dim=1)
        cos, sin = self.rotary_emb(positions, inputs_embeds.dtype)
        x, residual = inputs_embeds, None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, cos, sin, cache, meta)
            if i < len(features):
                x = residual + x
                x[deepstack.rows] += features[i]
                residual = None
        if residual is None:
            return self.norm(x)
        return self.norm.add_and_norm(residual, x)[1]
