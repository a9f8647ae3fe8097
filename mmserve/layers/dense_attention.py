"""Attention of every query over every key (no mask), the vision towers' kind: on CPU in
bfloat16, mmserve's kernel on AVX-512 BF16 dot products (``kernels/csrc/dense_attention_bf16.cpp``)
where the CPU has them; else torch's ``F.scaled_dot_product_attention``.

On 2 threads of an AMD EPYC with ``avx512_bf16`` (``benchmarks/dense_attention.py --rounds 7``,
medians) the kernel ran the Qwen2-VL-2B tower's attention (16 heads of 80 over 1,024 patches)
at 291 GFLOP/s, SDPA at 149 (the bfloat16 GEMM runs at about 430); SigLIP-so400m's (16 heads
of 72, 729 patches) at 248 against 124, CLIP ViT-L's at 223 against 108. A 448x448 request's
TTFT at the Qwen2-VL-2B shape went from 6.2-6.4 s to 5.6-5.8 s (3 alternated fresh processes
per build).
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
