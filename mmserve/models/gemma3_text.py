"""Gemma 3's decoder over the paged KV cache, built from mmserve's Llama decoder and shared
layers: (1 + weight) RMSNorm, q/k norms, embeddings scaled by sqrt(hidden), gelu-tanh MLP
between pre/post feed-forward norms, and local (sliding-window, ``rope_local_base_freq``) /
global (``rope_theta`` + linear scaling) layers, each kind with its own ``RotaryEmbedding``.
``attn_logit_softcapping`` and ``final_logit_softcapping`` are not applied: transformers'
``Gemma3ForConditionalGeneration`` ignores both (only its text-only ``Gemma3ForCausalLM``
caps logits), and released Gemma 3 configs leave them null.

Parameter names follow transformers' ``Gemma3TextModel`` (q/k/v and gate/up are
``StackedLinear``s the loader fills shard by shard).
"""

from __future__ import annotations

from typing import Any

import torch

from mmserve.layers.attention import AttentionMetadata, PagedKVCache
from mmserve.layers.norm import RMSNorm
from mmserve.layers.rotary import rotary_from_parameters
from mmserve.models.llama import Attention, DecoderLayer, LlamaModel

SLIDING, FULL = "sliding_attention", "full_attention"
NORM_OFFSET = 1.0  # Gemma's RMSNorm scales by 1 + weight


class Gemma3Attention(Attention):
    """Llama attention with Gemma's (1 + weight) q/k norms, ``query_pre_attn_scalar`` scale
    and, on local layers, a sliding window."""

    def __init__(self, cfg: Any, layer_idx: int, qkv_bias: bool, o_bias: bool) -> None:
        local = cfg.layer_types[layer_idx] == SLIDING
        super().__init__(
            cfg,
            layer_idx,
            qkv_bias,
            o_bias,
            qk_norm_offset=NORM_OFFSET,
            sliding_window=cfg.sliding_window if local else None,
            scale=cfg.query_pre_attn_scalar**-0.5,
        )
        self.layer_type = SLIDING if local else FULL


class Gemma3DecoderLayer(DecoderLayer):
    """Llama's layer with Gemma's norms, gelu-tanh MLP and norms after attention and after the
    MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``) as well as before."""

    self_attn: Gemma3Attention

    def __init__(
        self,
        cfg: Any,
        layer_idx: int,
        qkv_bias: bool,
        o_bias: bool,
        attention_cls: type[Attention] = Gemma3Attention,
    ) -> None:
        super().__init__(
            cfg, layer_idx, qkv_bias, o_bias, attention_cls, cfg.hidden_activation, NORM_OFFSET
        )
        dim, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.pre_feedforward_layernorm = RMSNorm(dim, eps, NORM_OFFSET)
        self.post_feedforward_layernorm = RMSNorm(dim, eps, NORM_OFFSET)

    def forward(self, x, residual, cos, sin, cache, meta):
        """(this layer's normed MLP output, the residual stream before adding it), as
        ``DecoderLayer``; the sums are transformers' in its order."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            residual, h = self.input_layernorm.add_and_norm(residual, x)
        h = self.post_attention_layernorm(self.self_attn(h, cos, sin, cache, meta))
        residual, h = self.pre_feedforward_layernorm.add_and_norm(residual, h)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class Gemma3TextModel(LlamaModel):
    """Llama's decoder with Gemma 3's layers, embeddings scaled by sqrt(hidden) and one RoPE
    per layer type; ``forward`` takes already-spliced embeddings (``embed`` scales token
    embeddings, image rows are replaced after it, as in transformers)."""

    def __init__(self, cfg: Any) -> None:
        if cfg.use_bidirectional_attention:
            raise ValueError(
                "Gemma 3 with use_bidirectional_attention (an encoder) is not supported"
            )
        rope = cfg.rope_parameters
        super().__init__(
            cfg,
            rotary_emb=rotary_from_parameters(cfg.head_dim, rope[FULL]),
            attention_cls=Gemma3Attention,
            layer_cls=Gemma3DecoderLayer,
            norm_weight_offset=NORM_OFFSET,
        )
        self.local_rotary_emb = rotary_from_parameters(cfg.head_dim, rope[SLIDING])
        self.embed_scale = cfg.hidden_size**0.5

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight
        return self.embed_tokens(token_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype)

    def rope_tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> dict[str, tuple[torch.Tensor, ...]]:
        """Layer type -> (cos, sin) of ``positions``."""
        return {
            FULL: self.rotary_emb(positions, dtype),
            SLIDING: self.local_rotary_emb(positions, dtype),
        }

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        tables = self.rope_tables(positions, inputs_embeds.dtype)
        x, residual = inputs_embeds, None
        for layer in self.layers:
            assert isinstance(layer, Gemma3DecoderLayer)
            cos, sin = tables[layer.self_attn.layer_type]
            x, residual = layer(x, residual, cos, sin, cache, meta)
        assert residual is not None, "a decoder without layers"
        return self.norm.add_and_norm(residual, x)[1]
