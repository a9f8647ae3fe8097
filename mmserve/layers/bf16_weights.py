"""float32 linears whose weights are bfloat16 values, kept as bfloat16 on CPU.

A bfloat16 checkpoint served in float32 (``--dtype auto`` on a CPU without native bfloat16)
widens every weight to float32 exactly: the values stay bfloat16 values, in twice the bytes.
``use_bf16_weights`` (``linear.py``) keeps such a weight as its bfloat16 bits, packed in tiles for
``bf16_weight_linear.cpp``, which computes every product and sum in float32: the arithmetic
``F.linear`` does on the widened weight, on half the bytes. A decode step reads every weight
once, so it takes about half the time. On one layer pair of the Qwen2-VL-2B shape's language
model (``benchmarks/bf16_weight_linear.py``, 2 AVX2 threads) the kernel ran 1.8-2.4x oneDNN's
packed float32 product at 1 row and 1.3-2.9x at 8, and within 10 % of it either way from 90
rows up.

From ``UNPACK_ROWS`` rows up (a vision tower's patches of several images or tiles) a call
widens the weight for itself (``bf16_weight_unpack``, transposed) and runs oneDNN's ``addmm`` on
it. Medians of 7 alternated rounds on 2 AVX2 threads, GFLOP/s, kernel vs widened + oneDNN
(``benchmarks/bf16_weight_linear.py --rounds 7 --rows 1024,2048,4096 --layer L``), on the
layers of Qwen2-VL-2B's language model, its vision tower and SmolVLM-256M's: at 1,024 rows
132 / 125 / 122 vs 101 / 108 / 107; at 2,048 133 / 116 / 115 vs 115 / 115 / 118; at 4,096
110 / 120 / 101 vs 109 / 117 / 112 (and SmolVLM's tower, 5,120 rows inside the engine: 111-139
on the kernel, oneDNN 160-165 alone). A weight whose float32 form exceeds ``UNPACK_BYTES``
stays on the kernel (no call allocates more than that).

``MMSERVE_BF16_WEIGHTS=0`` turns this off (every float32 weight is then packed for oneDNN,
``linear.py``).
"""

from __future__ import annotations

import torch

from mmserve.kernels import cpu_ops

BF16_WEIGHTS_ENV_VAR = "MMSERVE_BF16_WEIGHTS"
UNPACK_ROWS = 3072  # rows from which a call widens the weight for oneDNN
UNPACK_BYTES = 256 << 20  # the largest widened weight a call allocates


def pack_bf16_exact(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] float32 as bfloat16 tiles [ceil(N / tile), K, tile] (the layout in
    ``bf16_weight_tiles.h``; the last tile padded with zeros), or None when a value of it
    is not a bfloat16 value (widening the tiles would not give the weight back)."""
    ops = cpu_ops()
    assert ops is not None
    n, k = weight.shape
    if n and (weight[0].contiguous().view(torch.int32) & 0xFFFF).any():
        return None  # a float32 checkpoint's weight: no tiles allocated, no pass over it all
    tile = ops.bf16_weight_tile_rows
    tiles = torch.empty((n + tile - 1) // tile, k, tile, dtype=torch.bfloat16)
    return tiles if ops.bf16_weight_pack(weight.contiguous(), tiles) == 0 else None


def bf16_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``packed = pack_bf16_exact(weight)`` of ``n`` rows.
    ``x`` may have no rows, as ``F.linear``'s may: a chunked prefill step that ends no prompt
    asks the head for no logits."""
    if x.numel() == 0:
        return x.new_empty(*x.shape[:-1], n)
    ops = cpu_ops()
    assert ops is not None
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # the LM's rows are 2-D already
    tiles, k, tile = packed.shape
    if flat.shape[0] >= UNPACK_ROWS and tiles * tile * k * 4 <= UNPACK_BYTES:
        widened = torch.empty(k, tiles * tile)
        ops.bf16_weight_unpack(packed, widened)
        weight_t = widened[:, :n]
        out = torch.mm(flat, weight_t) if bias is None else torch.addmm(bias, flat, weight_t)
    else:
        out = ops.bf16_weight_linear(flat, packed, bias, n)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)
