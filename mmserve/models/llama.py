"""Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) over the paged KV cache.

Parameter names follow HF's ``LlamaModel`` so checkpoints load without renaming; Qwen2 is the
same decoder with q/k/v biases.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from mmserve.layers.attention import AttentionMetadata, PagedKVCache, paged_attention
from mmserve.layers.fused_linear import StackedLinear
from mmserve.layers.linear import Linear
from mmserve.layers.norm import RMSNorm
from mmserve.layers.rotary import RotaryEmbedding, apply_rope_to_heads_, rope_theta


class Attention(nn.Module):
    """GQA attention with RoPE over the paged KV cache, q/k/v fused in one projection.

    The models' differences are parameters: ``qk_norm_offset`` (``None``: no q/k norms)
    adds an ``RMSNorm`` over each q and each k head before RoPE (``q_norm``, ``k_norm``)
    with that weight offset (Qwen3: 0, Gemma: 1); ``sliding_window`` limits each query to
    that many latest keys (the torch attention path); ``scale`` replaces ``head_dim**-0.5``.
    """

    def __init__(
        self,
        cfg: Any,
        layer_idx: int,
        qkv_bias: bool,
        o_bias: bool,
        *,
        qk_norm_offset: float | None = None,
        sliding_window: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        hidden = cfg.hidden_size
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shards = [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)]
        self.qkv_proj = StackedLinear(hidden, shards, bias=qkv_bias)
        self.o_proj = Linear(q_size, hidden, bias=o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_offset is not None:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, qk_norm_offset)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, qk_norm_offset)

    def _norm_qk_heads_(self, qkv: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm) -> None:
        """Normalize each q and k head of the fused ``qkv`` rows in place."""
        t, d = qkv.shape[0], self.head_dim
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        qkv[:, :q_size] = q_norm(qkv[:, :q_size].reshape(-1, d)).view(t, q_size)
        k_rows = slice(q_size, q_size + kv_size)
        qkv[:, k_rows] = k_norm(qkv[:, k_rows].reshape(-1, d)).view(t, kv_size)

    def forward(self, x, cos, sin, cache: PagedKVCache, meta: AttentionMetadata) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) * D]: q heads, k heads, v heads
        if self.q_norm is not None and self.k_norm is not None:
            self._norm_qk_heads_(qkv, self.q_norm, self.k_norm)
        apply_rope_to_heads_(qkv, self.num_heads + self.num_kv_heads, cos, sin)
        q, k, v = self.qkv_proj.split(qkv)
        out = paged_attention(
            self.layer_idx,
            cache,
            q.view(t, self.num_heads, d),
            k.view(t, self.num_kv_heads, d),
            v.view(t, self.num_kv_heads, d),
            meta,
            self.scale,
            self.sliding_window,
        )
        return self.o_proj(out.view(t, -1))


# HF ``hidden_act`` name -> the gate's activation (it may overwrite its input, a view of the
# fused gate/up output).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": partial(nn.functional.silu, inplace=True),
    "gelu_pytorch_tanh": partial(nn.functional.gelu, approximate="tanh"),
}


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``, SwiGLU by default."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, activation: str = "silu"
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"MLP activation {activation!r} is not supported ({', '.join(ACTIVATIONS)})"
            )
        shards = [("gate_proj", intermediate), ("up_proj", intermediate)]
        self.gate_up_proj = StackedLinear(hidden, shards, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; ``activation`` (default: the config's ``hidden_act``) and
    ``norm_weight_offset`` go to ``MLP`` and ``RMSNorm``."""

    def __init__(
        self,
        cfg,
        layer_idx: int,
        qkv_bias: bool,
        o_bias: bool,
        attention_cls: type[Attention] = Attention,
        activation: str | None = None,
        norm_weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        dim, eps = cfg.hidden_size, cfg.rms_norm_eps
        activation = cfg.hidden_act if activation is None else activation
        self.self_attn = attention_cls(cfg, layer_idx, qkv_bias, o_bias)
        self.mlp = MLP(dim, cfg.intermediate_size, getattr(cfg, "mlp_bias", False), activation)
        self.input_layernorm = RMSNorm(dim, eps, norm_weight_offset)
        self.post_attention_layernorm = RMSNorm(dim, eps, norm_weight_offset)

    def forward(self, x, residual, cos, sin, cache, meta):
        """(this layer's MLP output, the residual stream before adding it): the residual add
        is fused into the next norm, as in vLLM; the sums are HF's, in the same order."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            residual, h = self.input_layernorm.add_and_norm(residual, x)
        h = self.self_attn(h, cos, sin, cache, meta)
        residual, h = self.post_attention_layernorm.add_and_norm(residual, h)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    """Embeddings + decoder layers + final norm; input is already-spliced embeddings.

    ``rotary_emb`` replaces the default RoPE (e.g. ``MRotaryEmbedding``, whose positions are
    [3, T] instead of [T]); it is called as ``rotary_emb(positions, dtype) -> (cos, sin)``.
    ``attention_cls`` replaces the attention of every layer (e.g. Qwen3's, with q/k norms),
    ``layer_cls`` the decoder layer (built as ``layer_cls(cfg, i, qkv_bias, o_bias,
    attention_cls)``); ``norm_weight_offset`` is the final norm's (``RMSNorm``).
    """

    def __init__(
        self,
        cfg,
        qkv_bias: bool | None = None,
        o_bias: bool | None = None,
        rotary_emb: nn.Module | None = None,
        attention_cls: type[Attention] = Attention,
        layer_cls: type[DecoderLayer] = DecoderLayer,
        norm_weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        bias = getattr(cfg, "attention_bias", False)
        qkv_bias = bias if qkv_bias is None else qkv_bias
        o_bias = bias if o_bias is None else o_bias
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            layer_cls(cfg, i, qkv_bias, o_bias, attention_cls) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, norm_weight_offset)
        if rotary_emb is None:
            first = cast(DecoderLayer, self.layers[0])
            rotary_emb = RotaryEmbedding(first.self_attn.head_dim, rope_theta(cfg))
        self.rotary_emb = rotary_emb

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of ``token_ids`` (before any image rows are spliced in)."""
        return self.embed_tokens(token_ids)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cos, sin = self.rotary_emb(positions, inputs_embeds.dtype)
        x, residual = inputs_embeds, None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin, cache, meta)
        assert residual is not None, "a decoder without layers"
        return self.norm.add_and_norm(residual, x)[1]


class LlamaLMHeadMixin:
    """The text half of mmserve's model contract for a VLM holding ``language_model``
    (``LlamaModel``) and ``lm_head``: KV geometry, ``embed``, ``forward``, ``compute_logits``.
    Call ``_set_kv_geometry(text_config)`` at the end of ``__init__``."""

    language_model: LlamaModel
    lm_head: Linear
    uses_mrope = False
    deepstack_layers = 0
    image_attention = "causal"
    attention_masks: str | None = None
    num_layers: int
    num_kv_heads: int
    head_dim: int

    def _set_kv_geometry(self, text_config: Any) -> None:
        attn = cast(DecoderLayer, self.language_model.layers[0]).self_attn
        self.num_layers = text_config.num_hidden_layers
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim

    @staticmethod
    def max_tokens_per_video_group(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """The most embeddings one temporal frame group of a video gives; 0: no video input."""
        return 0

    @staticmethod
    def tied_weights(hf_config) -> dict[str, str]:
        """``lm_head.weight`` copies the input embeddings when the checkpoint ties them."""
        if not getattr(hf_config, "tie_word_embeddings", False):
            return {}
        return {"lm_head.weight": "language_model.embed_tokens.weight"}

    @staticmethod
    def embedding_width(hf_config: Any) -> int:
        """Width of one image embedding row as ``encode_images`` returns it."""
        return int(hf_config.text_config.hidden_size)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed(token_ids)

    def forward(self, inputs_embeds, positions, cache, meta, deepstack=None) -> torch.Tensor:
        if deepstack is not None:
            raise ValueError(f"{type(self).__name__} has no DeepStack layers")
        return self.language_model(inputs_embeds, positions, cache, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def mrope_positions(self, num_tokens: int, mm_items: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not use M-RoPE")
