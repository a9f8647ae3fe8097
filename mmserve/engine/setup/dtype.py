"""``--dtype``: the dtype the engine serves in, and the start-up line that says why."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from mmserve.config import resolve_dtype
from mmserve.kernels.cpu_features import HALF_DTYPE_FLAGS, native_half_dtypes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DtypeChoice:
    """The resolved dtype and why, in words (logged once at start-up)."""

    dtype: str
    reason: str

    def log_line(self) -> str:
        return f"dtype: {self.dtype} ({self.reason})"


def choose_dtype(
    requested: str,
    declared: str | None,
    device: str,
    cpu_native: Mapping[str, tuple[str, ...]] | None = None,
) -> DtypeChoice:
    """``resolve_dtype`` with ``cpu_native`` (half dtype -> the CPU flags that run it; default
    this CPU's, ``native_half_dtypes``) and the reason for its answer."""
    native = native_half_dtypes() if cpu_native is None else dict(cpu_native)
    dtype = resolve_dtype(requested, declared, device, tuple(native))
    on = "CUDA" if device.split(":")[0] != "cpu" else "CPU"
    if requested != "auto":
        return DtypeChoice(dtype, f"--dtype {requested}")
    half = declared in HALF_DTYPE_FLAGS
    if on == "CUDA":
        why = f"the checkpoint's {declared}" if half else f"the checkpoint declares {declared}"
        return DtypeChoice(dtype, f"auto on CUDA: {why}")
    if not half:
        return DtypeChoice(dtype, f"auto on CPU: the checkpoint declares {declared}")
    assert declared is not None
    if dtype == declared:
        flags = ", ".join(native[declared])
        return DtypeChoice(
            dtype, f"auto on CPU: the checkpoint's {declared}, native here ({flags})"
        )
    needed = " or ".join(HALF_DTYPE_FLAGS[declared])
    return DtypeChoice(
        dtype, f"auto on CPU: the checkpoint is {declared} but this CPU lacks {needed}"
    )


def log_dtype_choice(choice: DtypeChoice) -> None:
    logger.info(choice.log_line())
