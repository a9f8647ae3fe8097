"""bfloat16 linears on AVX-512 BF16 dot products, on one packing for every row count.

On a CPU with AVX-512 BF16 and no AMX, ``use_bf16_dot_weights`` (``linear.py``) packs every
bfloat16 weight once in column pairs (``bf16_dot_linear.cpp``, whose header gives the layout),
instead of oneDNN's prepacked layout: on the Qwen2-VL-2B shape's language-model layers a
decode step's 1-8 rows read the weights 1.07-1.42x as fast as oneDNN's packed product, and a
prefill's rows run at 0.96-1.06x its GEMM rate (``benchmarks/bf16_dot_linear.py``'s doc has
the table). Where the CPU has AMX,
oneDNN's tiles multiply faster than dot products can, and oneDNN's packing stays.

``MMSERVE_BF16_DOT_WEIGHTS=0`` turns this off (bfloat16 weights are then packed for oneDNN).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F

from mmserve.kernels import bf16_dot_linear_kernel
from mmserve.kernels.cpu_features import cpu_flags

BF16_DOT_WEIGHTS_ENV_VAR = "MMSERVE_BF16_DOT_WEIGHTS"
BLOCK_ROWS = 16  # weight rows per block of the packing


def bf16_dot_kernel() -> Callable[..., torch.Tensor] | None:
    """The kernel where bfloat16 linears should run it: built, on a CPU with AVX-512 BF16 and
    without AMX-BF16, and not turned off by ``MMSERVE_BF16_DOT_WEIGHTS=0``; else None."""
    if os.environ.get(BF16_DOT_WEIGHTS_ENV_VAR, "1") == "0" or "amx_bf16" in cpu_flags():
        return None
    return bf16_dot_linear_kernel()


def pack_bf16_pairs(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] bfloat16 (K even) as [ceil(N / 16), K / 2, 32]: blocks of 16 rows
    (zeros past row N), each holding its rows' values of columns 2j and 2j + 1 side by side for
    every j. Raises ValueError for another dtype or an odd K."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.shape[1] % 2:
        raise ValueError(
            f"weight must be bfloat16 [out, in] with an even in, not {weight.dtype}"
            f" {list(weight.shape)}"
        )
    n, k = weight.shape
    padded = F.pad(weight, (0, 0, 0, -n % BLOCK_ROWS)) if n % BLOCK_ROWS else weight
    blocks = padded.reshape(-1, BLOCK_ROWS, k // 2, 2).permute(0, 2, 1, 3)
    # a new buffer always (permuting a weight of 2 columns is a view): the caller frees the weight
    packed = torch.empty(blocks.shape[0], k // 2, 2 * BLOCK_ROWS, dtype=torch.bfloat16)
    packed.view(blocks.shape).copy_(blocks)
    return packed


def bf16_dot_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``packed = pack_bf16_pairs(weight)`` of ``n`` rows, any
    leading dims of ``x`` (none of its rows: an empty result)."""
    kernel = _kernel()
    if x.dim() == 2:  # the LM's rows are 2-D already
        return kernel(x, packed, bias, n)
    out = kernel(x.reshape(-1, x.shape[-1]), packed, bias, n)
    return out.reshape(*x.shape[:-1], n)


@cache
def _kernel() -> Callable[..., torch.Tensor]:
    """The op, looked up once: ``bf16_dot_linear`` runs on every step of every layer, and only
    on weights that ``use_bf16_dot_weights`` packed where the kernel exists."""
    kernel = bf16_dot_linear_kernel()
    assert kernel is not None
    return kernel
