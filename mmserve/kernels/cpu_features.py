"""Which half-precision dtypes this CPU computes natively, from its feature flags.

``--dtype auto`` serves a checkpoint's half dtype on CPU only where the CPU has the instructions
for it (vLLM's CPU backend does the same): bfloat16 with AVX-512 BF16 or AMX-BF16, float16
with AVX-512 FP16 or AMX-FP16. Elsewhere torch emulates half-precision matmuls through float32
conversions, slower than float32 itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

# dtype -> the CPU flags (as /proc/cpuinfo names them) any one of which runs it natively
HALF_DTYPE_FLAGS: dict[str, tuple[str, ...]] = {
    "bfloat16": ("avx512_bf16", "amx_bf16"),
    "float16": ("avx512_fp16", "amx_fp16"),
}
CPUINFO = Path("/proc/cpuinfo")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first ``flags`` (x86) or ``Features`` (Arm) line of a cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (empty where /proc/cpuinfo cannot be read, e.g. macOS)."""
    try:
        return parse_cpu_flags(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def native_half_dtypes(flags: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Half dtype -> the flags of ``flags`` (default: this CPU's) that run it natively; a dtype
    the CPU lacks every flag for is absent."""
    present = cpu_flags() if flags is None else frozenset(flags)
    found = {
        dtype: tuple(f for f in needed if f in present)
        for dtype, needed in HALF_DTYPE_FLAGS.items()
    }
    return {dtype: names for dtype, names in found.items() if names}
