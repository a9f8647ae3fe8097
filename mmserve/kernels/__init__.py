"""mmserve's compiled CPU kernels, when the install built them (see ``setup.py``).

``cpu_ops()`` is the extension module for this CPU (of the instruction-set variants it runs,
``variants.py``, the widest one the install built: ``paged_attention``, ``rms_norm``,
``add_rms_norm``, ``rotary_embedding``, in the dtypes of ``kernel_dtypes()``;
``small_batch_linear`` in bfloat16/float16), or None;
``unavailable_reason()`` says why not.
``MMSERVE_DISABLE_CPU_KERNELS=1`` turns them all off (the pure-torch paths run instead).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from mmserve.kernels.variants import ENV_VAR, runnable_variants

logger = logging.getLogger(__name__)


@cache
def _load() -> tuple[Any, str]:
    if os.environ.get("MMSERVE_DISABLE_CPU_KERNELS", "") not in ("", "0"):
        return None, "MMSERVE_DISABLE_CPU_KERNELS is set"
    capability = torch.backends.cpu.get_cpu_capability()
    errors = []
    for variant in runnable_variants(capability):
        try:
            return importlib.import_module(f"mmserve.kernels._C_{variant}"), ""
        except ImportError as exc:
            errors.append(f"{variant}: {exc}")
    return None, (
        f"no CPU kernel for capability {capability} ({'; '.join(errors)}); the install builds "
        f"the variant of the CPU it runs on when torch and a C++ compiler are there "
        f"(pip install --no-build-isolation), {ENV_VAR}=all builds every variant"
    )


def cpu_ops() -> Any:
    """The extension module, or None."""
    return _load()[0]


def paged_attention_kernel() -> Callable[..., torch.Tensor] | None:
    module, _ = _load()
    return None if module is None else module.paged_attention


def kernel_head_dims() -> tuple[int, ...]:
    module, _ = _load()
    return () if module is None else tuple(module.supported_head_dims())


def kernel_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes the built kernels take (float32, bfloat16, float16; float32 only for a
    build older than the half-precision kernels); empty without a kernel."""
    module, _ = _load()
    if module is None:
        return ()
    names = module.supported_dtypes() if hasattr(module, "supported_dtypes") else ["float32"]
    return tuple(getattr(torch, name) for name in names)


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
    return dtype in kernel_dtypes() and all(
        t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous() for t in tensors
    )


def small_batch_linear_kernel() -> tuple[Callable[..., torch.Tensor], int] | None:
    """``(small_batch_linear, max_rows)``: ``x @ weight.T + bias`` for 1 to ``max_rows`` rows of
    bfloat16/float16 CPU tensors (decode steps), or None for a build without it."""
    module, _ = _load()
    if module is None or not hasattr(module, "small_batch_linear"):
        return None
    return module.small_batch_linear, int(module.small_batch_linear_max_rows)
