"""The CPU kernels in bfloat16 and float16 (half in, float32 arithmetic, half out) against
float32 references, and the sampler's float32 logits."""

from __future__ import annotations

import pytest
import torch

from mmserve.kernels import cpu_kernels_apply, cpu_ops, kernel_dtypes, paged_attention_kernel
from mmserve.layers.attention import (
    AttentionMetadata,
    PagedKVCache,
    paged_attention,
    select_attention_backend,
)
from mmserve.layers.norm import RMSNorm
from mmserve.layers.rotary import RotaryEmbedding, apply_rope, apply_rope_to_heads_
from mmserve.sampling_params import SamplingParams
from mmserve.worker.logits_processors import TokenHistory
from mmserve.worker.sampler import sample
from tests.layers.test_paged_attention import BATCHES, build_batch, naive_attention

CPU = torch.device("cpu")
HALF = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def half_kernels_built() -> None:
    assert {torch.bfloat16, torch.float16} <= set(kernel_dtypes()), kernel_dtypes()


@pytest.mark.parametrize("dtype", HALF)
def test_auto_takes_the_kernel_in_half_precision_and_names_what_it_lacks(dtype) -> None:
    assert select_attention_backend("auto", CPU, dtype, 64) == "cpu-kernel"
    assert select_attention_backend("auto", CPU, torch.float64, 64) == "torch"
    with pytest.raises(ValueError, match="the CPU kernel has no float64"):
        select_attention_backend("cpu-kernel", CPU, torch.float64, 64)


def half_case(batch: str, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype):
    seqs = BATCHES[batch]
    num_blocks = sum(-(-total // block_size) for total, _ in seqs) + 7
    table, qsl, lens, slots = build_batch(seqs, block_size, num_blocks, seed=heads)
    gen = torch.Generator().manual_seed(1)
    shape = (num_blocks * block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(int(qsl[-1]), heads, head_dim, generator=gen).to(dtype)
    return seqs, table, qsl, lens, slots, q, k_cache, v_cache


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(8, 4, 64, 16), (4, 4, 32, 16), (7, 1, 128, 32), (6, 2, 80, 5)],
)
def test_half_attention_is_the_float_reference_rounded_once(
    dtype, batch, heads, kv_heads, head_dim, block_size
) -> None:
    """Same half inputs: the kernel's half output is the float64 result of those inputs,
    rounded to the dtype (one rounding, float32 accumulation: within one ulp)."""
    _, table, qsl, lens, _, q, k_cache, v_cache = half_case(
        batch, heads, kv_heads, head_dim, block_size, dtype
    )
    kernel = paged_attention_kernel()
    assert kernel is not None
    scale = head_dim**-0.5
    out = kernel(q, k_cache, v_cache, table.int(), qsl.int(), lens.int(), scale, block_size)
    assert out.dtype == dtype
    exact = naive_attention(
        q.float(), k_cache.float(), v_cache.float(), table, qsl, lens, block_size, scale
    )
    ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(2**-6)  # one ulp (2x the rounding)
    assert ((out.float() - exact).abs() <= ulp + 1e-6).all()
    # the float32 kernel on the same inputs, rounded once, agrees to the same ulp
    as_float = kernel(
        q.float(), k_cache.float(), v_cache.float(), table.int(), qsl.int(), lens.int(),
        scale, block_size,
    )  # fmt: skip
    assert ((out.float() - as_float.to(dtype).float()).abs() <= ulp + 1e-6).all()


@pytest.mark.parametrize("dtype", HALF)
def test_the_engine_path_in_half_matches_the_torch_backend(dtype) -> None:
    """Through ``paged_attention`` (cache writes included), both in the half dtype: the kernel
    is at least as close to the float64 result as gather + SDPA (which rounds the
    probabilities to the dtype), and the two agree within a few ulps."""
    seqs = BATCHES["mixed step"]
    block_size, heads, kv_heads, head_dim = 16, 8, 2, 64
    num_blocks = sum(-(-total // block_size) for total, _ in seqs) + 3
    table, qsl, lens, slots = build_batch(seqs, block_size, num_blocks, seed=5)
    gen = torch.Generator().manual_seed(3)
    tokens = int(qsl[-1])
    q, k, v = (torch.randn(tokens, h, head_dim, generator=gen).to(dtype)
               for h in (heads, kv_heads, kv_heads))  # fmt: skip
    outs = []
    for use_kernel in (True, False):
        cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, CPU)
        torch.manual_seed(0)
        cache.keys[0].normal_()
        cache.values[0].normal_()
        meta = AttentionMetadata(
            slots, qsl.int(), lens.int(), table.int(), block_size,
            [n for _, n in seqs], [t for t, _ in seqs], use_kernel=use_kernel,
        )  # fmt: skip
        outs.append(paged_attention(0, cache, q, k, v, meta, head_dim**-0.5))
    assert outs[0].dtype == outs[1].dtype == dtype
    keys, values = cache.keys[0].float(), cache.values[0].float()
    exact = naive_attention(q.float(), keys, values, table, qsl, lens, block_size, head_dim**-0.5)
    kernel_err, torch_err = ((o.float() - exact).abs().max() for o in outs)
    assert kernel_err <= torch_err
    torch.testing.assert_close(outs[0], outs[1], rtol=0.0, atol=8 * torch.finfo(dtype).eps)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("dim", [512, 100, 7])
def test_half_rms_norm_and_fused_add_round_as_transformers(dtype, dim) -> None:
    gen = torch.Generator().manual_seed(dim)
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.normal_(generator=gen)
    norm = norm.to(dtype)
    x = (torch.randn(37, dim, generator=gen) * 3).to(dtype)
    delta = torch.randn(37, dim, generator=gen).to(dtype)
    eps = torch.finfo(dtype).eps
    with torch.inference_mode():
        assert cpu_kernels_apply(x, norm.weight)
        out = norm(x)
        expected = hf_rms_norm(x, norm.weight, norm.eps)
        residual = x.clone()
        summed, normed = norm.add_and_norm(residual, delta)
    assert out.dtype == dtype
    # float32 sums in another order: at most one ulp of the normalized row, then the product
    torch.testing.assert_close(out, expected, rtol=2 * eps, atol=1e-5)
    assert summed is residual and torch.equal(summed, x + delta)  # in place, bit-exact
    torch.testing.assert_close(
        normed, hf_rms_norm(x + delta, norm.weight, norm.eps), rtol=2 * eps, atol=1e-5
    )


@pytest.mark.parametrize("dtype", HALF)
def test_half_rope_on_fused_rows_is_bit_exact(dtype) -> None:
    heads, kv_heads, head_dim, tokens = 8, 4, 64, 29
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    cos, sin = RotaryEmbedding(head_dim, 10000.0)(torch.arange(100, 100 + tokens), dtype)
    qk = qkv[:, : (heads + kv_heads) * head_dim].reshape(tokens, heads + kv_heads, head_dim)
    expected = apply_rope(qk, cos, sin)
    with torch.inference_mode():
        assert cpu_kernels_apply(qkv, cos, sin)
        fused = qkv.clone()
        apply_rope_to_heads_(fused, heads + kv_heads, cos, sin)
    rotated = fused[:, : (heads + kv_heads) * head_dim].reshape(expected.shape)
    assert torch.equal(rotated, expected)
    assert torch.equal(
        fused[:, (heads + kv_heads) * head_dim :], qkv[:, (heads + kv_heads) * head_dim :]
    )


def test_the_ops_reject_mixed_dtypes() -> None:
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    assert not cpu_kernels_apply(x, torch.ones(16))
    with pytest.raises(RuntimeError, match="of x's dtype"):
        cpu_ops().rms_norm(x, torch.ones(16), 1e-6)


def test_the_sampler_processes_half_logits_in_float32() -> None:
    """bf16 logits 0.99609375 and 1.0; a frequency penalty of 0.0035 on the second leaves it
    ahead in float32 (0.9965) but would round to a tie in bfloat16 (argmax: the first)."""
    logits = torch.tensor([[0.99609375, 1.0, -5.0]], dtype=torch.bfloat16)
    params = [SamplingParams(temperature=0, frequency_penalty=0.0035, logprobs=2)]
    out = sample(logits, params, [None], [TokenHistory([2, 1], 1)])
    assert out.token_ids == [1]
    top = out.logprobs[0]
    assert top is not None and [t for t, _ in top.top] == [1, 0]  # raw logprobs, float32
