"""Scheduling priority for a benchmark run: raised when permitted, recorded in every result.

On Linux with ``kernel.sched_autogroup_enabled=1`` the CPU is shared between *autogroups* (one
per session) before ``nice`` ranks the processes inside one, so ``nice`` alone does not shield a
benchmark from a busy session next to it. ``raise_priority()`` writes -20 to
``/proc/self/autogroup`` (root, or CAP_SYS_NICE) -- this ranks the whole autogroup, i.e. the
session that started the benchmark, child processes such as the vLLM worker included -- and also
lowers the process's own nice value (what counts when autogroups are off). The previous autogroup
value is restored at exit. What was obtained, or why not, is recorded in every result
(``env.priority``). Other sessions that raised theirs as well still get their fair share: the
per-run ``others_cores`` (``engines/meter.py``) shows how much they took.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")
AUTOGROUP = Path("/proc/self/autogroup")
_PRIORITY: dict[str, Any] = {"requested": False}


def _read_autogroup_nice() -> int | None:
    """The nice value of this process's autogroup ("/autogroup-7 nice -20"), None if unknown."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _autogroups_enabled() -> bool | None:
    try:
        return AUTOGROUP_ENABLED.read_text().strip() == "1"
    except OSError:
        return None


def priority_state() -> dict[str, Any]:
    """The scheduling priority this process has now, plus what ``raise_priority`` attempted."""
    state: dict[str, Any] = {
        "autogroups_enabled": _autogroups_enabled(),
        "autogroup_nice": _read_autogroup_nice(),
        "process_nice": os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None,
    }
    state.update(_PRIORITY)
    if state["autogroups_enabled"]:
        state["effective"] = f"autogroup nice {state['autogroup_nice']}"
    else:
        state["effective"] = f"process nice {state['process_nice']}"
    return state


def raise_priority(nice: int = -20) -> dict[str, Any]:
    """Raise this process's (and its autogroup's) scheduling priority to ``nice`` if allowed.
    Idempotent; returns ``priority_state()`` with ``raised`` (bool) and ``reason`` when it could
    not (no such interface, not permitted, ...)."""
    if _PRIORITY.get("requested"):
        return priority_state()
    reasons: list[str] = []
    raised = False
    _PRIORITY.update(requested=True, target=nice)
    enabled = _autogroups_enabled()
    if enabled:
        before = _read_autogroup_nice()
        try:
            AUTOGROUP.write_text(str(nice))
        except OSError as exc:
            reasons.append(f"autogroup: {exc.strerror or exc} (needs root or CAP_SYS_NICE)")
        else:
            raised = _read_autogroup_nice() == nice
            if before is not None and before != nice:
                atexit.register(_restore_autogroup, before)
    elif enabled is None:
        reasons.append("autogroup: no /proc/sys/kernel/sched_autogroup_enabled (not Linux?)")
    else:
        reasons.append("autogroup: sched_autogroup_enabled=0 (process nice is what counts)")
    if hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:
            reasons.append(f"process nice: {exc.strerror or exc}")
        else:
            raised = raised or not enabled
    else:
        reasons.append("process nice: not supported on this platform")
    _PRIORITY["raised"] = raised
    if not raised:
        _PRIORITY["reason"] = "could not raise: " + "; ".join(reasons)
    elif reasons:
        _PRIORITY["notes"] = reasons
    return priority_state()


def _restore_autogroup(value: int) -> None:
    try:
        AUTOGROUP.write_text(str(value))
    except OSError:
        pass


def add_priority_arg(parser: Any) -> None:
    parser.add_argument(
        "--no-raise-priority",
        dest="raise_priority",
        action="store_false",
        help="keep the scheduling priority as it is (default: autogroup + process nice -20 "
        "when permitted; the result JSON records what was obtained)",
    )


def apply_priority(args: Any) -> dict[str, Any]:
    """``raise_priority()`` unless ``--no-raise-priority``; prints one line saying what holds."""
    state = raise_priority() if getattr(args, "raise_priority", True) else priority_state()
    line = state["effective"]
    if state.get("reason"):
        line += f" ({state['reason']})"
    print(f"scheduling priority: {line}")
    return state
