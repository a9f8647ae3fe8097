"""The compiled RMSNorm / residual-add / RoPE ops against the pure-torch ones they replace, and
fused q/k/v and gate/up projections against the separate layers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mmserve.kernels import cpu_kernels_apply, cpu_ops, unavailable_reason
from mmserve.layers.fused_linear import StackedLinear
from mmserve.layers.norm import RMSNorm
from mmserve.layers.rotary import RotaryEmbedding, apply_rope, apply_rope_to_heads_
from mmserve.models.checkpoint.loader import load_safetensors


@pytest.fixture(autouse=True)
def kernels_built():
    assert cpu_ops() is not None, unavailable_reason()


def torch_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return (
        norm.weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + norm.eps)
    ).float()


@pytest.mark.parametrize("dim", [512, 100, 7])
def test_rms_norm_and_fused_add(dim):
    gen = torch.Generator().manual_seed(dim)
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.normal_(generator=gen)
    x = torch.randn(37, dim, generator=gen) * 3
    delta = torch.randn(37, dim, generator=gen)
    with torch.inference_mode():
        assert cpu_kernels_apply(x, norm.weight)
        torch.testing.assert_close(norm(x), torch_rms_norm(norm, x), rtol=2e-6, atol=1e-6)
        expected_sum = x + delta
        residual = x.clone()
        summed, normed = norm.add_and_norm(residual, delta)
    assert summed is residual and torch.equal(summed, expected_sum)  # in place, bit-exact
    torch.testing.assert_close(normed, torch_rms_norm(norm, expected_sum), rtol=2e-6, atol=1e-6)


def test_rms_norm_falls_back_off_the_kernel_path():
    norm = RMSNorm(16, 1e-6).to(torch.float64)
    x = torch.randn(4, 16, dtype=torch.float64)
    assert not cpu_kernels_apply(x, norm.weight)
    with torch.inference_mode():
        residual, normed = norm.add_and_norm(x, x)
    assert normed.dtype == torch.float64 and torch.equal(residual, x + x)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(8, 4, 64), (2, 2, 6)])
def test_rope_on_fused_rows_is_bit_exact(heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(heads)
    tokens = 29
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    cos, sin = RotaryEmbedding(head_dim, 10000.0)(torch.arange(100, 100 + tokens), torch.float32)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    expected_q = apply_rope(q.reshape(tokens, heads, head_dim), cos, sin)
    expected_k = apply_rope(k.reshape(tokens, kv_heads, head_dim), cos, sin)
    expected_v = v.clone()
    with torch.inference_mode():
        fused = qkv.clone()
        apply_rope_to_heads_(fused, heads + kv_heads, cos, sin)
    q2, k2, v2 = fused.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    assert torch.equal(q2.reshape(tokens, heads, head_dim), expected_q)
    assert torch.equal(k2.reshape(tokens, kv_heads, head_dim), expected_k)
    assert torch.equal(v2, expected_v)


SHARDS = [("q_proj", 16), ("k_proj", 8), ("v_proj", 8)]


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_linear_loads_each_shard_from_its_checkpoint_name(bias, tmp_path):
    torch.manual_seed(0)
    separate = nn.ModuleDict({n: nn.Linear(32, size, bias=bias) for n, size in SHARDS})
    weights = {f"attn.{k}": v for k, v in separate.state_dict().items()}
    save_file(weights, tmp_path / "m.safetensors")
    model = nn.Module()
    model.attn = nn.Module()
    model.attn.qkv_proj = StackedLinear(32, SHARDS, bias=bias)
    load_safetensors(model, tmp_path, [])
    x = torch.randn(5, 32)
    with torch.inference_mode():
        parts = model.attn.qkv_proj.split(model.attn.qkv_proj(x))
    for (name, _), part in zip(SHARDS, parts, strict=True):
        torch.testing.assert_close(part, separate[name](x))


def test_stacked_linear_shard_missing_from_the_checkpoint_is_a_missing_key(tmp_path):
    weights = {f"attn.{n}.weight": torch.zeros(size, 32) for n, size in SHARDS[:2]}
    save_file(weights, tmp_path / "m.safetensors")
    model = nn.Module()
    model.attn = nn.Module()
    model.attn.qkv_proj = StackedLinear(32, SHARDS, bias=False)
    with pytest.raises(ValueError, match=r"missing keys \['attn.v_proj.weight'\]"):
        load_safetensors(model, tmp_path, [])
