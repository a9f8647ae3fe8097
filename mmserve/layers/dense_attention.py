"""Attention of every query over every key (no mask), the vision towers' kind: on CPU in
bfloat16, mmserve's kernel on AVX-512 BF16 dot products (``kernels/csrc/dense_attention_bf16.cpp``)
where the CPU has them; else torch's ``F.scaled_dot_product_attention``.

At the Qwen2-VL-2B vision tower's shape (16 heads of 80 over 1,024 patches, 2 threads, AMD EPYC
with ``avx512_bf16``) SDPA ran at about 150 GFLOP/s, where the bfloat16 GEMM runs at about 430;
``benchmarks/README.md`` has the kernel's rate beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmserve.kernels import dense_attention_bf16_kernel

MAX_KERNEL_HEAD_DIM = 128


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(head_dim)) v for ``[batch, seq, heads, head_dim]`` q, k, v (views are
    fine); returns ``[batch, seq, heads, head_dim]``."""
    head_dim = q.shape[-1]
    if (
        q.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and head_dim % 2 == 0
        and head_dim <= MAX_KERNEL_HEAD_DIM
        and not (torch.is_grad_enabled() and q.requires_grad)
    ):
        kernel = dense_attention_bf16_kernel()
        if kernel is not None and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1:
            return kernel(q, k, v, head_dim**-0.5)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)
