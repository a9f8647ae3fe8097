"""What a timed window cost and how much of the machine others took meanwhile (stdlib only).

Imported by the benchmarks and, as a plain module next to it, by ``vllm_worker.py`` (which runs
in vLLM's virtualenv and never imports mmserve), so every engine's runs are metered alike.

``Meter().stop()`` gives, for the window since ``Meter()``:
- ``wall_s``; ``cpu_s``: this process's user + system CPU seconds (threads included);
- ``others_cores``: CPU used by everything else on the machine (from ``/proc/stat``, minus this
  process), in cores on average: ~0 on a quiet machine; on 2 cores a value near 1 means another
  job took about half of it and the window's timing is suspect;
- ``runq_wait_s``: how long this process's threads waited for a CPU (``schedstat``);
- ``loadavg``: the 1-minute load average at the end.
Values are None where the platform does not expose them.
"""

from __future__ import annotations

import glob
import os
import resource
import time
from typing import Any


def _system_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _runq_wait_s() -> float | None:
    """Seconds this process's live threads have waited on a run queue (Linux schedstat)."""
    paths = glob.glob("/proc/self/task/*/schedstat")
    if not paths:
        return None
    total = 0
    for path in paths:
        try:
            with open(path) as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of process group ``pgid`` (Linux /proc;
    0.0 elsewhere): a server we started and its helper processes."""
    total = 0
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ... utime stime
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Meter:
    """Start on construction; ``stop()`` returns the window's numbers (see the module doc).
    ``pgid``: a process group whose CPU is ours too (a server under test): reported as
    ``server_cpu_s`` and not counted in ``others_cores``."""

    def __init__(self, pgid: int | None = None) -> None:
        self._pgid = pgid
        self._wall = time.perf_counter()
        self._cpu = _cpu_s()
        self._group = group_cpu_s(pgid) if pgid is not None else 0.0
        self._busy = _system_busy_s()
        self._wait = _runq_wait_s()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._wall
        cpu = _cpu_s() - self._cpu
        busy, wait = _system_busy_s(), _runq_wait_s()
        group = group_cpu_s(self._pgid) - self._group if self._pgid is not None else 0.0
        others = None
        if busy is not None and self._busy is not None and wall > 0:
            others = max(busy - self._busy - cpu - group, 0.0) / wall
        return {
            "wall_s": wall,
            "cpu_s": cpu,
            **({"server_cpu_s": group} if self._pgid is not None else {}),
            "others_cores": others,
            "runq_wait_s": None if wait is None or self._wait is None else wait - self._wait,
            "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
