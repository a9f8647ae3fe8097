"""Running the stages under their time boxes, failing soft (stdlib only).

The engine stages run in one child process (``child.py``) that reports each stage's start and
end on a progress file. A stage past its box (or past the run's deadline) has the child's
process group killed and is recorded as ``timeout``; a failed or killed stage ends that child,
and the stages not yet run start in a new one. ``pytest`` runs as its own process with
``--junitxml``, its counts read back from the XML. Every stage ends as one record:
``{"name", "kind", "model", "status": ok | failed | timeout | skipped, "seconds", "result" |
"error"}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mmserve.bench.gpu.plan import Profile, Stage

POLL_S = 0.2
MIN_START_S = 5.0  # a stage is not started with less of the budget left than this


def record(stage: Stage, status: str, seconds: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {
        "name": stage.name,
        "kind": stage.kind,
        "model": stage.model,
        "status": status,
        "seconds": seconds,
        **extra,
    }


def _kill(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its helpers
    except ProcessLookupError:
        pass
    proc.wait()


class Progress:
    """The events a child has appended to its progress file, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[: text.rfind("\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def run_child_stages(
    profile: Profile,
    stages: list[Stage],
    deadline: float,
    log: IO[str],
    on_record: Callable[[dict[str, Any]], None],
) -> None:
    """Run ``stages`` in engine processes until each has a record (see the module doc)."""
    pending = list(stages)
    by_name = {s.name: s for s in stages}
    with tempfile.TemporaryDirectory(prefix="mmserve-gpu-") as tmp:
        for attempt in range(len(stages)):
            if not pending:
                return
            if deadline - time.monotonic() < MIN_START_S:
                break
            plan = Path(tmp) / f"plan{attempt}.json"
            stage_dicts = [{"kind": s.kind, "box_s": s.box_s, "model": s.model} for s in pending]
            plan.write_text(json.dumps({"profile": profile.as_json(), "stages": stage_dicts}))
            progress = Progress(Path(tmp) / f"progress{attempt}.jsonl")
            cmd = [sys.executable, "-m", "mmserve.bench.gpu.child", str(plan), str(progress.path)]
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            current, started = None, 0.0
            while True:
                exited = proc.poll() is not None
                for event in progress.new_events():
                    stage = by_name[event["stage"]]
                    if event["event"] == "start":
                        current, started = stage, time.monotonic()
                    else:
                        result = {k: event[k] for k in ("result", "error") if k in event}
                        on_record(record(stage, event["status"], event["seconds"], **result))
                        pending.remove(stage)
                        current = None
                if exited:
                    break
                now = time.monotonic()
                limit = min(started + current.box_s, deadline) if current else deadline
                if now > limit:
                    _kill(proc)
                    if current is not None:
                        why = "its time box" if now > started + current.box_s else "the budget"
                        on_record(
                            record(
                                current,
                                "timeout",
                                now - started,
                                error=f"killed after {now - started:.0f} s ({why})",
                            )
                        )
                        pending.remove(current)
                    break
                time.sleep(POLL_S)
            if exited and current is not None:  # died inside a stage (a crash, not an exception)
                on_record(
                    record(
                        current,
                        "failed",
                        time.monotonic() - started,
                        error=f"engine process exited with code {proc.returncode}",
                    )
                )
                pending.remove(current)
            elif exited and proc.returncode not in (0, 3) and pending:
                for stage in pending:  # it never reached a stage: another try would fail alike
                    on_record(
                        record(
                            stage,
                            "failed",
                            error=f"engine process exited with "
                            f"code {proc.returncode} before its first stage",
                        )
                    )
                return
    for stage in pending:
        on_record(record(stage, "skipped", error="no time left in the run's budget"))


def pytest_counts(xml_path: Path) -> dict[str, Any]:
    """tests / failures / errors / skipped / passed and the first failing test ids."""
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {
        k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")
    }
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "failed_tests": failed[:20]}


def run_pytest(
    profile: Profile, stage: Stage, deadline: float, out: Path, root: Path
) -> dict[str, Any]:
    """The pytest stage: the profile's selection, in its own process, within the box."""
    box = min(stage.box_s, deadline - time.monotonic())
    if box < MIN_START_S:
        return record(stage, "skipped", error="no time left in the run's budget")
    xml, log_path = out / "pytest.xml", out / "pytest.log"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *profile.pytest_args,
    ]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=box)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return record(
                stage,
                "timeout",
                time.monotonic() - start,
                error=f"killed after {box:.0f} s; see pytest.log",
            )
    seconds = time.monotonic() - start
    if not xml.exists():
        return record(stage, "failed", seconds, error=f"pytest exited {code} without a report")
    counts = pytest_counts(xml)
    status = "ok" if code == 0 else "failed"
    return record(
        stage,
        status,
        seconds,
        result={"exit": code, **counts},
        **({} if code == 0 else {"error": f"pytest exited {code}"}),
    )
