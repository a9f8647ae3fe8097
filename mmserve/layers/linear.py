"""mmserve's Linear layer (the language model's, the vision towers' and the projectors'):
torch's GEMM, except on CPU.

- bfloat16 weights on a CPU with AVX-512 BF16 and without AMX are packed once in column pairs
  for mmserve's dot-product kernel, at every row count (``bf16_dot_weights.py``).
- Other half-precision weights on a CPU that computes their dtype natively (AMX, float16 on
  AVX-512 FP16, or bfloat16 on AVX-512 BF16 with ``MMSERVE_BF16_DOT_WEIGHTS=0``) are prepacked
  once for oneDNN, and every row count runs the packed product. On 8 layers of the
  Qwen2-VL-2B shape's language-model weights (0.75 GB, bfloat16, 2 threads, AMD EPYC with
  ``avx512_bf16``; two scratch runs, each the median of 3 passes in one process) it read 27-32 /
  28 / 38 / 25-30 GB/s at 1 / 2 / 4 / 8 rows, where the small-batch kernel read 29-30 / 22 / 15 /
  9 and ``F.linear`` 16-20 / - / 18 / 15-17; at 16 / 64 / 256 rows it ran 317 / 412 / 443 GFLOP/s
  against ``F.linear``'s 214 / 343 / 419. In the engine at that shape (3 alternated fresh
  processes per build, 24 tokens) decode went from 7.0-7.9 to 7.5-9.5 tok/s at batch 1 and
  from 2.5-2.7 to 6.0-7.3 tok/s a sequence at batch 8.
- Elsewhere, decode-sized inputs in half precision run mmserve's small-batch kernel, which reads
  the weights at close to memory speed (torch's bfloat16 matmul streams a 1-row input's weights
  at half of it, and an 8-row input's at a tenth, one row after another).
- float32 weights whose values are all bfloat16 values (a bfloat16 checkpoint served in float32)
  are kept as packed bfloat16 for mmserve's kernel, at every row count (``bf16_weights.py``).
- Other float32 weights are prepacked once for oneDNN (``torch.ops.mkldnn``, as vLLM's CPU backend
  does) and replace the dense ones, so memory stays the same. At the Qwen2-VL-2B shape's MLP
  (1536 x 8960, 12 weights in turn, 2 AVX2 threads) the packed product ran at 12.9 / 61.9 /
  132 / 120 / 124 GFLOP/s for 1 / 8 / 266 / 1024 / 2048 rows, where ``F.linear`` ran at 6.3 /
  17.3 / 114 / 121 / 122. Packing for a batch of ``PACK_ROWS`` rows was the best layout over
  that range (1 lost a fifth at 2048 rows; 64 a third at 1 row). The Qwen2-VL-2B shape's
  vision tower took 3.6-3.9 s packed against 4.2-4.8 s dense for 256 patches, and about the
  same either way for 1,024.
- A weight an embedding shares (a tied ``lm_head``) is packed as well, and its dense copy stays
  for the embedding's lookups (vLLM's CPU backend does the same): one more vocabulary x hidden
  matrix in memory (0.93 GB at the Qwen2-VL-2B shape). There the head's product took 51-58 ms
  packed against 70-76 ms dense for 1 row, and 77-90 ms against 282-302 ms for 8.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels import cpu_ops, small_batch_linear_kernel
from mmserve.kernels.cpu_features import native_half_dtypes
from mmserve.layers.bf16_dot_weights import bf16_dot_kernel, bf16_dot_linear, pack_bf16_pairs
from mmserve.layers.bf16_weights import BF16_WEIGHTS_ENV_VAR, bf16_linear, pack_bf16_exact

HALF_DTYPES = (torch.bfloat16, torch.float16)
# Called with a dense weight a packed copy replaced, which nothing reads any more.
Release = Callable[[torch.Tensor], object]
PACK_ROWS = 4  # the batch size oneDNN lays packed float32 weights out for (module doc)


class Linear(nn.Linear):
    """``nn.Linear`` that sends inputs of at most ``small_batch_rows`` rows to
    ``small_batch``, once ``use_small_batch_kernel`` has set it.

    Invariants: ``small_batch`` is set only on a module whose weight (and bias) is a contiguous
    CPU bfloat16/float16 tensor and that is not packed, and runs only with autograd off.
    ``packed`` is set only by ``use_packed_float32`` or ``use_packed_half``, which leave in
    ``weight`` a one-element stand-in of its shape, dtype and device (what model code reads of
    it), or, where an embedding shares the weight, the weight itself: every input then runs the
    packed product (no autograd).
    ``bf16_packed`` is set only by ``use_bf16_weights`` (``bf16_weights.py``), and
    ``dot_packed`` only by ``use_bf16_dot_weights`` (``bf16_dot_weights.py``), each with the
    same stand-in; at most one of ``bf16_packed``, ``dot_packed`` and ``packed`` is set, and
    with any of them ``small_batch`` stays None.
    """

    small_batch: Callable[..., torch.Tensor] | None = None
    small_batch_rows = 0
    packed: torch.Tensor | None = None
    bf16_packed: torch.Tensor | None = None
    dot_packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dot_packed is not None:
            return bf16_dot_linear(x, self.dot_packed, self.bias, self.out_features)
        if self.bf16_packed is not None:
            return bf16_linear(x, self.bf16_packed, self.bias, self.out_features)
        if self.packed is not None:
            rows = x.reshape(-1, x.shape[-1])
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
            return out.reshape(*x.shape[:-1], out.shape[-1])
        kernel = self.small_batch
        if kernel is not None and x.dim() == 2 and x.shape[0] <= self.small_batch_rows:
            if not torch.is_grad_enabled():  # the kernel has no backward
                return kernel(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_small_batch_kernel(model: nn.Module) -> int:
    """Enable the small-batch kernel on every ``Linear`` of ``model`` it applies to (see the
    class invariant); returns how many. 0 without a kernel build or off the CPU or in float32."""
    kernel = small_batch_linear_kernel()
    if kernel is None:
        return 0
    function, rows = kernel
    enabled = 0
    for module in model.modules():
        if not isinstance(module, Linear) or is_packed(module):
            continue
        params = [module.weight] + ([module.bias] if module.bias is not None else [])
        if module.weight.dtype in HALF_DTYPES and all(
            p.device.type == "cpu" and p.dtype == module.weight.dtype and p.is_contiguous()
            for p in params
        ):
            module.small_batch, module.small_batch_rows = function, rows
            enabled += 1
    return enabled


def onednn_half_dtypes() -> frozenset[torch.dtype]:
    """The half dtypes this CPU computes natively (``native_half_dtypes``, the same fact that
    ``--dtype auto`` reads) and for which torch's oneDNN has kernels."""
    if not torch.backends.mkldnn.is_available():
        return frozenset()
    supported = {
        torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
        torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
    }
    native = {getattr(torch, name) for name in native_half_dtypes()}
    return frozenset(dtype for dtype in native if supported.get(dtype, False))


def use_packed_half(
    model: nn.Module, dtypes: frozenset[torch.dtype], release: Release | None = None
) -> int:
    """Prepack for oneDNN the weight of every CPU ``Linear`` of ``model`` whose weight (and bias)
    has a dtype of ``dtypes`` (``onednn_half_dtypes()`` at load), and drop its dense copy unless
    an embedding shares it; returns how many (see the module doc)."""
    return _pack_for_onednn(model, dtypes, release) if dtypes else 0


def use_packed_float32(model: nn.Module, release: Release | None = None) -> int:
    """Prepack the float32 weight of every CPU ``Linear`` of ``model`` for oneDNN (see the
    module doc) and drop its dense copy unless an embedding shares it; returns how many. 0
    where torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return 0
    return _pack_for_onednn(model, frozenset({torch.float32}), release)


def _pack_for_onednn(
    model: nn.Module, dtypes: frozenset[torch.dtype], release: Release | None
) -> int:
    """``packed`` for every CPU ``Linear`` of ``model`` not packed yet (any way) whose weight
    and bias have a dtype of ``dtypes``; returns how many."""

    def pack(module: Linear) -> bool:
        weight, bias = module.weight, module.bias
        if weight.dtype not in dtypes or (bias is not None and bias.dtype != weight.dtype):
            return False
        module.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)
        return True

    return _pack_each(model, pack, release)


def use_bf16_weights(model: nn.Module, release: Release | None = None) -> int:
    """Keep the float32 weight of every CPU ``Linear`` of ``model`` as packed bfloat16 where
    all its values are bfloat16 values (and its bias, if any, is float32); returns how many.
    0 without the kernels or with ``MMSERVE_BF16_WEIGHTS=0``. A weight an embedding shares
    keeps its float32 copy for the lookups."""
    if cpu_ops() is None or os.environ.get(BF16_WEIGHTS_ENV_VAR, "1") == "0":
        return 0

    def pack(module: Linear) -> bool:
        weight, bias = module.weight, module.bias
        if module.small_batch is not None or weight.dtype != torch.float32:
            return False
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            return False  # the kernel adds a contiguous float32 bias
        module.bf16_packed = pack_bf16_exact(weight)
        return module.bf16_packed is not None

    return _pack_each(model, pack, release)


def use_bf16_dot_weights(model: nn.Module, release: Release | None = None) -> int:
    """Pack the bfloat16 weight of every CPU ``Linear`` of ``model`` not packed yet in column
    pairs for the dot-product kernel (its bias, if any, bfloat16 too; an even number of inputs)
    and drop its dense copy unless an embedding shares it; returns how many. 0 where
    ``bf16_dot_kernel()`` is None."""
    if bf16_dot_kernel() is None:
        return 0

    def pack(module: Linear) -> bool:
        weight, bias = module.weight, module.bias
        if weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
            return False
        if bias is not None and (bias.dtype != torch.bfloat16 or not bias.is_contiguous()):
            return False
        module.dot_packed = pack_bf16_pairs(weight)
        return True

    return _pack_each(model, pack, release)


def _pack_each(model: nn.Module, pack: Callable[[Linear], bool], release: Release | None) -> int:
    """``pack`` (which sets one packing on a module it takes, and says whether it did), without
    autograd, on every CPU ``Linear`` of ``model`` not packed yet; each module it packs
    loses its small-batch kernel and its dense copy, unless an embedding shares the weight
    (``_drop_dense_copy``). Returns how many it packed."""
    shared = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    count = 0
    for module in model.modules():
        if not isinstance(module, Linear) or is_packed(module):
            continue
        if module.weight.device.type != "cpu":
            continue
        with torch.no_grad():
            if not pack(module):
                continue
        module.small_batch, module.small_batch_rows = None, 0
        count += 1
        _drop_dense_copy(module, shared, release)
    return count


def is_packed(module: Linear) -> bool:
    """Whether a packed copy replaced ``module``'s weight (any of the three packings)."""
    return (
        module.packed is not None or module.bf16_packed is not None or module.dot_packed is not None
    )


def _drop_dense_copy(module: Linear, shared: set[int], release: Release | None) -> None:
    """Replace a packed module's weight with a one-element stand-in of its shape, dtype and
    device (what model code reads of it), unless an embedding's lookups read it (``shared``);
    ``release`` gets the dropped weight (the loader gives back its mapped pages)."""
    weight = module.weight
    if id(weight) in shared:
        return
    stand_in = weight.new_zeros(1).expand(weight.shape)  # no storage of its own
    module.weight = nn.Parameter(stand_in, requires_grad=False)
    if release is not None:
        release(weight.detach())
