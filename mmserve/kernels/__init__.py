"""mmserve's compiled CPU kernels, when the install built them (see ``setup.py``).

``cpu_ops()`` is the kernels' ops for this CPU (of the instruction-set variants it runs,
``variants.py``, the widest one the install built: ``paged_attention``, ``rms_norm``,
``add_rms_norm``, ``rotary_embedding``, in the dtypes of ``kernel_dtypes()``;
``small_batch_linear`` in bfloat16/float16; ``dense_attention_bf16`` and ``bf16_dot_linear``
where the CPU has AVX-512 BF16, ``dense_attention_bf16_kernel`` and ``bf16_dot_linear_kernel``),
or None;
``unavailable_reason()`` says why not.
``MMSERVE_DISABLE_CPU_KERNELS=1`` turns them all off (the pure-torch paths run instead).

Each variant is a library (``_C_<variant>.*.so``, no Python module) whose ops register with
torch's dispatcher when it is loaded, as ``torch.ops.mmserve_<variant>.<op>``
(``variants.ops_namespace``); errors in their arguments raise RuntimeError.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from mmserve.kernels.cpu_features import cpu_flags
from mmserve.kernels.variants import ENV_VAR, ops_namespace, runnable_variants

logger = logging.getLogger(__name__)


class KernelOps:
    """One variant's ops. Each is its op's one overload (``torch.ops.<ns>.<op>.default``):
    called directly, it skips the overload lookup of ``torch.ops.<ns>.<op>(...)`` (~1 us)."""

    def __init__(self, variant: str) -> None:
        ops = getattr(torch.ops, ops_namespace(variant))
        self.variant = variant
        self.paged_attention: Callable[..., torch.Tensor] = ops.paged_attention.default
        self.rms_norm: Callable[..., torch.Tensor] = ops.rms_norm.default
        self.add_rms_norm: Callable[..., torch.Tensor] = ops.add_rms_norm.default
        self.rotary_embedding: Callable[..., None] = ops.rotary_embedding.default
        self.rotary_embedding_float: Callable[..., torch.Tensor] = (
            ops.rotary_embedding_float.default
        )
        self.small_batch_linear: Callable[..., torch.Tensor] = ops.small_batch_linear.default
        self.small_batch_linear_max_rows = int(ops.small_batch_linear_max_rows())
        self.bf16_weight_linear: Callable[..., torch.Tensor] = ops.bf16_weight_linear.default
        self.bf16_weight_pack: Callable[..., int] = ops.bf16_weight_pack.default
        self.bf16_weight_unpack: Callable[..., None] = ops.bf16_weight_unpack.default
        self.bf16_weight_tile_rows = int(ops.bf16_weight_tile_rows())
        self.dense_attention_bf16: Callable[..., torch.Tensor] = ops.dense_attention_bf16.default
        self.bf16_dot_linear: Callable[..., torch.Tensor] = ops.bf16_dot_linear.default
        self.head_dims = tuple(int(d) for d in ops.supported_head_dims())
        self.dtypes = tuple(getattr(torch, name) for name in ops.supported_dtypes())

    def __repr__(self) -> str:
        return f"<mmserve CPU kernels {self.variant}: torch.ops.{ops_namespace(self.variant)}>"


def load_variant(variant: str) -> KernelOps:
    """Loads the library of one variant (once per process; variants load side by side).
    ImportError when the install did not build it; OSError when it does not load."""
    spec = importlib.util.find_spec(f"mmserve.kernels._C_{variant}")
    if spec is None or spec.origin is None:
        raise ImportError(f"mmserve/kernels/_C_{variant} was not built")
    torch.ops.load_library(spec.origin)
    try:
        return KernelOps(variant)
    except AttributeError as exc:  # a library that registers other ops (an older build)
        raise ImportError(f"{spec.origin} lacks this mmserve's ops: {exc}") from exc


@cache
def _load() -> tuple[KernelOps | None, str]:
    if os.environ.get("MMSERVE_DISABLE_CPU_KERNELS", "") not in ("", "0"):
        return None, "MMSERVE_DISABLE_CPU_KERNELS is set"
    capability = torch.backends.cpu.get_cpu_capability()
    errors = []
    for variant in runnable_variants(capability):
        try:
            return load_variant(variant), ""
        except (ImportError, OSError) as exc:
            errors.append(f"{variant}: {exc}")
    return None, (
        f"no CPU kernel for capability {capability} ({'; '.join(errors)}); the install builds "
        f"the variant of the CPU it runs on when torch and a C++ compiler are there "
        f"(pip install --no-build-isolation), {ENV_VAR}=all builds every variant"
    )


def cpu_ops() -> Any:
    """The ``KernelOps`` of this CPU, or None."""
    return _load()[0]


def paged_attention_kernel() -> Callable[..., torch.Tensor] | None:
    ops, _ = _load()
    return None if ops is None else ops.paged_attention


def kernel_head_dims() -> tuple[int, ...]:
    ops, _ = _load()
    return () if ops is None else ops.head_dims


def kernel_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes the built kernels take (float32, bfloat16, float16); empty without a kernel."""
    ops, _ = _load()
    return () if ops is None else ops.dtypes


def unavailable_reason() -> str:
    return _load()[1]


def cpu_kernels_apply(*tensors: torch.Tensor) -> bool:
    """The compiled CPU ops apply: contiguous CPU tensors of one dtype the kernels take
    (``kernel_dtypes``), nothing for autograd to record (they have no backward)."""
    if cpu_ops() is None or not tensors:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    dtype = tensors[0].dtype
    if dtype not in kernel_dtypes():
        return False
    for t in tensors:  # a loop, not all(genexpr): this runs a few times per layer and step
        if not t.is_cpu or t.dtype != dtype or not t.is_contiguous():
            return False
    return True


def small_batch_linear_kernel() -> tuple[Callable[..., torch.Tensor], int] | None:
    """``(small_batch_linear, max_rows)``: ``x @ weight.T + bias`` for 1 to ``max_rows`` rows of
    bfloat16/float16 CPU tensors (decode steps), or None without a kernel."""
    ops, _ = _load()
    return None if ops is None else (ops.small_batch_linear, ops.small_batch_linear_max_rows)


def dense_attention_bf16_kernel() -> Callable[..., torch.Tensor] | None:
    """``dense_attention_bf16(q, k, v, scale)``: attention over every key for bfloat16
    ``[batch, seq, heads, head_dim]`` CPU tensors (the last dim contiguous, head_dim even and at
    most 128), or None: it needs the AVX-512 build and a CPU with AVX-512 BF16."""
    ops = _avx512_bf16_ops()
    return None if ops is None else ops.dense_attention_bf16


def bf16_dot_linear_kernel() -> Callable[..., torch.Tensor] | None:
    """``bf16_dot_linear(x, packed, bias, n)``: ``x @ w.T + bias`` for bfloat16 CPU tensors, the
    weight packed in column pairs (``layers/bf16_dot_weights.py``), or None: it needs the
    AVX-512 build and a CPU with AVX-512 BF16."""
    ops = _avx512_bf16_ops()
    return None if ops is None else ops.bf16_dot_linear


def _avx512_bf16_ops() -> KernelOps | None:
    """The kernels' ops where they are the AVX-512 build on a CPU with AVX-512 BF16, else None."""
    ops, _ = _load()
    if ops is None or ops.variant != "avx512" or "avx512_bf16" not in cpu_flags():
        return None
    return ops
