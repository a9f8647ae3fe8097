"""Gemma 3's decoder over the paged KV cache: (1 + weight) RMSNorm, q/k norms, embeddings
scaled by sqrt(hidden), gelu-tanh MLP between pre/post feed-forward norms, and local
(sliding-window, ``rope_local_base_freq``) / global (``rope_theta`` + linear scaling) layers.
``attn_logit_softcapping`` and ``final_logit_softcapping`` are not applied: transformers'
``Gemma3ForConditionalGeneration`` ignores both (only its text-only ``Gemma3ForCausalLM``
caps logits), and released Gemma 3 configs leave them null.

Parameter names follow transformers' ``Gemma3TextModel`` (q/k/v and gate/up are
``StackedLinear``s the loader fills shard by shard).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmserve.layers.attention import AttentionMetadata, PagedKVCache, paged_attention
from mmserve.layers.fused_linear import StackedLinear
from mmserve.layers.rotary import apply_rope

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaling by ``1 + weight``, in float32, rounded once at the end (HF's order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaRotary(nn.Module):
    """RoPE of one layer type: base ``theta``, frequencies divided by a linear ``factor``.
    The frequencies are a plain attribute (not a buffer), so building on the meta device and
    loading leave them intact."""

    def __init__(self, head_dim: int, params: dict[str, Any]) -> None:
        super().__init__()
        rope_type = params.get("rope_type", "default")
        if rope_type not in ("default", "linear"):
            raise ValueError(f"Gemma 3 rope type {rope_type!r} is not supported (default, linear)")
        factor = float(params.get("factor", 1.0)) if rope_type == "linear" else 1.0
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
        self.freqs = 1.0 / (float(params["rope_theta"]) ** (exponents / head_dim)) / factor

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = positions.float()[:, None] * self.freqs.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: Any, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.is_sliding = cfg.layer_types[layer_idx] == SLIDING
        self.sliding_window = cfg.sliding_window if self.is_sliding else None
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shards = [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)]
        self.qkv_proj = StackedLinear(cfg.hidden_size, shards, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache: PagedKVCache, meta: AttentionMetadata) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = apply_rope(self.q_norm(q.view(t, self.num_heads, d)), cos, sin)
        k = apply_rope(self.k_norm(k.view(t, self.num_kv_heads, d)), cos, sin)
        out = paged_attention(
            self.layer_idx,
            cache,
            q,
            k,
            v.reshape(t, self.num_kv_heads, d),
            meta,
            self.scale,
            self.sliding_window,
        )
        return self.o_proj(out.view(t, -1))


class Gemma3MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        shards = [("gate_proj", intermediate), ("up_proj", intermediate)]
        self.gate_up_proj = StackedLinear(hidden, shards, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(nn.functional.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: Any, layer_idx: int) -> None:
        super().__init__()
        if cfg.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"Gemma 3 activation {cfg.hidden_activation!r} is not supported")
        dim, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma3Attention(cfg, layer_idx)
        self.mlp = Gemma3MLP(dim, cfg.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(dim, eps)
        self.post_attention_layernorm = GemmaRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(dim, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(dim, eps)

    def forward(self, x, cos, sin, cache, meta) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), cos, sin, cache, meta)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3TextModel(nn.Module):
    """Embeddings (scaled by sqrt(hidden)) + decoder layers + final norm; ``forward`` takes
    already-spliced embeddings (``embed`` scales token embeddings, image rows are replaced
    after it, as in transformers)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        if cfg.use_bidirectional_attention:
            raise ValueError(
                "Gemma 3 with use_bidirectional_attention (an encoder) is not supported"
            )
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_scale = cfg.hidden_size**0.5
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        rope = cfg.rope_parameters
        self.rotary = nn.ModuleDict({kind: GemmaRotary(cfg.head_dim, rope[kind]) for kind in rope})

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight
        return self.embed_tokens(token_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        dtype = inputs_embeds.dtype
        tables = {kind: rotary(positions, dtype) for kind, rotary in self.rotary.items()}
        x = inputs_embeds
        for layer in self.layers:
            assert isinstance(layer, Gemma3DecoderLayer)
            cos, sin = tables[SLIDING if layer.self_attn.is_sliding else FULL]
            x = layer(x, cos, sin, cache, meta)
        return self.norm(x)
