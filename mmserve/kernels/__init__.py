"""mmserve's compiled CPU kernels, when the install built them (see ``setup.py``).

``paged_attention_kernel()`` returns the extension's ``paged_attention`` for this CPU (the
widest instruction-set variant the CPU runs), or None; ``unavailable_reason()`` says why not.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

logger = logging.getLogger(__name__)

# torch's CPU capability -> extension variants it can run, widest first.
VARIANTS_BY_CAPABILITY = {
    "AVX512": ("avx512", "avx2", "generic"),
    "AVX512_BF16": ("avx512", "avx2", "generic"),
    "AMX": ("avx512", "avx2", "generic"),
    "AVX2": ("avx2", "generic"),
}


@cache
def _load() -> tuple[Any | None, str]:
    capability = torch.backends.cpu.get_cpu_capability()
    errors = []
    for variant in VARIANTS_BY_CAPABILITY.get(capability, ("generic",)):
        try:
            return importlib.import_module(f"mmserve.kernels._paged_attention_{variant}"), ""
        except ImportError as exc:
            errors.append(f"{variant}: {exc}")
    return None, f"no CPU kernel for capability {capability} ({'; '.join(errors)})"


def paged_attention_kernel() -> Callable[..., torch.Tensor] | None:
    module, _ = _load()
    return None if module is None else module.paged_attention


def kernel_head_dims() -> tuple[int, ...]:
    module, _ = _load()
    return () if module is None else tuple(module.supported_head_dims())


def unavailable_reason() -> str:
    return _load()[1]
