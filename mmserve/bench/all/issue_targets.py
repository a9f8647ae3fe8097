"""Issue 14's performance targets (mmserve against vLLM and the FLOP floor), checked on the
ratios a ``mmserve bench all`` run measured."""

from __future__ import annotations

import json
from pathlib import Path

from mmserve.bench.lib.result_files import load_result, reuse_files


def targets_table(out: Path, llava: str, qwen: str) -> str:
    """Issue 14's targets, as ratios measured in this run."""

    def reuse_ratio(name: str) -> float | None:
        data = load_result(out, name)
        if data is None:
            return None
        by = {r["engine"]: r for r in data["rows"]}
        if "mmserve" in by and "vllm" in by:
            return by["mmserve"]["req_per_s"] / by["vllm"]["req_per_s"]
        return None

    def turn_ratio(model: str) -> float | None:
        files = sorted(out.glob(f"multiturn_{Path(model).name}_*.json"))
        if not files:
            return None
        rows = json.loads(files[0].read_text())["rows"]
        last = max(r["turn"] for r in rows)
        by = {r["engine"]: r for r in rows if r["turn"] == last}
        if "mmserve" in by and "vllm" in by:
            return by["mmserve"]["ttft_s"] / by["vllm"]["ttft_s"]
        return None

    def floor_ratio() -> float | None:
        data = load_result(out, f"floor_{Path(llava).name}.json")
        rows = {r["engine"]: r for r in (data or {}).get("rows", [])}
        return rows["mmserve"]["time_over_floor"] if "mmserve" in rows else None

    def serve_ratio(concurrency: int) -> float | None:
        files = sorted(out.glob("serve_launch_*.json"))
        if not files:
            return None
        rows = json.loads(files[0].read_text())["rows"]
        by = {r["server"]: r for r in rows if r["concurrency"] == concurrency}
        if "mmserve" in by and "vllm" in by:
            return by["mmserve"]["req_per_s"] / by["vllm"]["req_per_s"]
        return None

    files = reuse_files(llava)
    checks = [
        ("reuse 0 %: mmserve / vLLM req/s", reuse_ratio(files[0][1]), ">=", 1.10),
        ("30 % grouped: mmserve / vLLM req/s", reuse_ratio(files[1][1]), ">=", 1.25),
        ("Zipf D=32: mmserve / vLLM req/s", reuse_ratio(files[3][1]), ">=", 1.35),
        ("Qwen2-VL last-turn TTFT: mmserve / vLLM", turn_ratio(qwen), "<=", 0.85),
        ("LLaVA last-turn TTFT: mmserve / vLLM", turn_ratio(llava), "<", 1.0),
        ("serve c32, 30 % reuse: mmserve / vLLM req/s", serve_ratio(32), ">=", 1.4),
        ("reuse 0 %: mmserve time / FLOP floor", floor_ratio(), "<=", 1.6),
    ]
    lines = ["| target | measured | goal | |", "|---|---|---|---|"]
    for label, value, op, goal in checks:
        if value is None:
            lines.append(f"| {label} | not measured | {op} {goal} | |")
            continue
        met = {">=": value >= goal, "<=": value <= goal, "<": value < goal}[op]
        lines.append(f"| {label} | {value:.2f} | {op} {goal} | {'met' if met else 'missed'} |")
    return "\n".join(lines)
