"""Keep freed CPU memory for reuse instead of faulting in fresh pages every step (glibc only).

Why: with glibc's defaults, a block above the *dynamic* mmap threshold is a fresh ``mmap`` (and
``munmap`` on free), and free space at the top of the heap is trimmed back to the OS; either way
the next step's temporaries of the same size page-fault their memory in again (each fault
zeroes a 4 KiB page: ~4 us here). How often that happens depends on the heap's history: when
the encoder cache keeps image embeddings alive between the per-step temporaries (caches on),
runs took 24k-485k minor faults more than with the encoder cache off (~0) on the reuse-0 %
benchmark -- up to ~2 s of 19 s on one core, the "caches on are 3.6-7.8 % slower at 0 % reuse"
gap (issue 14). A fixed threshold at glibc's maximum (32 MiB: every tensor below it comes from
the heap and is reused), no trimming, and a top pad remove that dependence.

Cost: the process keeps its peak heap (RSS does not shrink after a burst). No effect with
another allocator preloaded or outside glibc.

Opt-in (``MMSERVE_MALLOC_TUNING=1``): it removed the faults but not measurably the time. In
``mmserve bench envs`` (reuse 0 %, 200 requests, a fresh process per run, 3 interleaved rounds)
it ran at 0.99x glibc's defaults (22.8 vs 23.1 req/s, spreads overlapping), while preloading
tcmalloc ran at 1.04x and jemalloc at 0.81x (benchmarks/README.md).
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)
TOP_PAD = 64 << 20
TRIM_THRESHOLD = (1 << 31) - 1  # int: "never" in practice
ENV = "MMSERVE_MALLOC_TUNING"
_applied: bool | None = None


def set_malloc(mmap_threshold: int, trim_threshold: int, top_pad: int) -> bool:
    """glibc's ``mallopt`` for the three settings (True if all were accepted, False outside
    glibc). Fixing the mmap threshold also turns off glibc's dynamic one."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, mmap_threshold),
            (M_TRIM_THRESHOLD, trim_threshold),
            (M_TOP_PAD, top_pad),
        )
    )


def tune_malloc() -> bool:
    """Apply the settings once per process if ``MMSERVE_MALLOC_TUNING=1`` (True if glibc
    accepted them). Idempotent; a later ``mallopt`` (e.g. the encoder-memory probe's) still
    overrides them."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV, "0") != "1":
        return False
    _applied = set_malloc(MMAP_THRESHOLD_MAX, TRIM_THRESHOLD, TOP_PAD)
    if not _applied:
        logger.debug("glibc rejected a malloc setting; allocator left partly at its defaults")
    return _applied
