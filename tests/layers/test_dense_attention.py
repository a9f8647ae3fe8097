"""Attention over every key (the vision towers'): the AVX-512 BF16 kernel is as close to a float32
reference as torch's bfloat16 SDPA is, at the towers' shapes, on strided views, with ragged
sequence lengths and head dims; it refuses what it does not take with a RuntimeError naming it;
``dense_attention`` runs it only in bfloat16 on CPU, and everything else exactly as before
(SDPA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmserve.kernels import dense_attention_bf16_kernel
from mmserve.layers import dense_attention as module
from mmserve.layers.dense_attention import dense_attention

KERNEL = dense_attention_bf16_kernel()
needs_kernel = pytest.mark.skipif(
    KERNEL is None, reason="no AVX-512 build of the kernels, or no AVX-512 BF16 on this CPU"
)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on [batch, seq, heads, head_dim], in the inputs' dtype."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)


def random_qkv(batch: int, seq: int, heads: int, head_dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, seq, 3, heads, head_dim, generator=g).to(torch.bfloat16)
    return qkv.unbind(2)  # strided views, as the towers pass them


@needs_kernel
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1024, 16, 80),  # Qwen2-VL's tower, one 448x448 image
        (2, 729, 16, 72),  # SigLIP-so400m (LLaVA-OneVision), two tiles
        (1, 577, 16, 64),  # CLIP ViT-L/14-336
        (3, 17, 2, 128),
        (1, 1, 1, 2),
        (2, 33, 3, 6),
    ],
)
def test_the_kernel_is_as_close_to_float32_as_sdpa(shape: tuple[int, int, int, int]) -> None:
    q, k, v = random_qkv(*shape, seed=sum(shape))
    reference = sdpa(q.float(), k.float(), v.float())
    assert KERNEL is not None
    out = KERNEL(q, k, v, shape[-1] ** -0.5)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    kernel_error = (out.float() - reference).abs().max().item()
    sdpa_error = (sdpa(q, k, v).float() - reference).abs().max().item()
    assert kernel_error <= 1.5 * sdpa_error + 1e-3


@needs_kernel
def test_each_row_attends_to_its_own_batch_and_head() -> None:
    q, k, v = random_qkv(2, 40, 3, 16, seed=1)
    assert KERNEL is not None
    whole = KERNEL(q, k, v, 0.25)
    one = KERNEL(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:], 0.25)
    torch.testing.assert_close(whole[1:, :, 2:], one, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q: q.float(), "bfloat16"),
        (lambda q: q[..., :7], "one shape"),
        (lambda q: q.transpose(2, 3), "contiguous last dim"),
        (lambda q: q[0], "batch, seq, heads, head_dim"),
    ],
)
def test_the_kernel_refuses_what_it_does_not_take(change, message: str) -> None:
    q, k, v = random_qkv(1, 8, 2, 8, seed=0)
    assert KERNEL is not None
    with pytest.raises(RuntimeError, match=message):
        KERNEL(change(q), k, v, 1.0)
    odd = [t[..., :7].contiguous() for t in (q, k, v)]
    with pytest.raises(RuntimeError, match="head_dim must be even"):
        KERNEL(*odd, 1.0)


def test_dense_attention_runs_sdpa_outside_bfloat16_on_cpu_bit_for_bit() -> None:
    q, k, v = (t.float() for t in random_qkv(2, 30, 4, 16, seed=3))
    assert torch.equal(dense_attention(q, k, v), sdpa(q, k, v))
    q, k, v = random_qkv(1, 12, 2, 7 * 2 + 1, seed=4)  # an odd head dim: SDPA in bfloat16
    assert torch.equal(dense_attention(q, k, v), sdpa(q, k, v))


def test_dense_attention_calls_the_kernel_in_bfloat16_when_there_is_one(monkeypatch) -> None:
    calls = []

    def spy(q, k, v, scale):
        calls.append(scale)
        return sdpa(q, k, v)

    monkeypatch.setattr(module, "dense_attention_bf16_kernel", lambda: spy)
    q, k, v = random_qkv(1, 12, 2, 16, seed=5)
    dense_attention(q, k, v)
    assert calls == [16**-0.5]
    dense_attention(q.float(), k.float(), v.float())
    assert len(calls) == 1  # float32: SDPA
