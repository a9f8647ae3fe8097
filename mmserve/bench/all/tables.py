"""The README's result tables, rendered from the JSON files a ``mmserve bench all`` run wrote
(each section's own result files; missing ones are skipped)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from mmserve.bench.all.issue_targets import targets_table
from mmserve.bench.lib.result_files import load_result, reuse_files
from mmserve.bench.lib.table_cells import ENGINE_LABELS, rounds_cell, spread_cell

LLAVA, QWEN = "tiny-llava-small", "tiny-qwen2-vl-small"
ADVERSARIAL = Path(__file__).resolve().parents[3] / "benchmarks" / "adversarial_load.py"


def multiturn_table(data: dict[str, Any]) -> str:
    rows = data["rows"]
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    turns = sorted({r["turn"] for r in rows})
    shown = [t for t in turns if t in (1, 2) or t % 2 == 0 or t == turns[-1]]
    by = {(r["engine"], r["turn"]): r for r in rows}
    head = ["turn", *(ENGINE_LABELS.get(e, e) for e in engines)]
    head += ["images encoded (mmserve / nocache)", "cached tokens (mmserve)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in shown:
        cells = [str(t), *(spread_cell(by.get((e, t)), "ttft_s") for e in engines)]
        on, off = by.get(("mmserve", t)), by.get(("mmserve-nocache", t))
        enc = f"{on.get('images_encoded', '–') if on else '–'} / "
        enc += f"{off.get('images_encoded', '–') if off else '–'}"
        cells += [enc, str(on.get("cached_tokens", "–")) if on else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    last = turns[-1]

    def ttft(engine: str) -> float | None:
        row = by.get((engine, last))
        return row["ttft_s"] if row else None

    notes = []
    mm = ttft("mmserve")
    for engine in engines[1:]:
        other = ttft(engine)
        if mm and other:
            notes.append(f"{ENGINE_LABELS.get(engine, engine)} / mmserve = {other / mm:.2f}")
    lines.append("")
    lines.append(
        f"Turn {last} TTFT ratios: "
        + "; ".join(notes)
        + "; uncontended rounds: "
        + rounds_cell([r for r in rows if r["turn"] == last])
        + "."
    )
    return "\n".join(lines)


def reuse_table(out: Path, model: str) -> str:
    loaded = [(label, load_result(out, name)) for label, name in reuse_files(model)]
    engines = ["mmserve", "mmserve-prefix-off", "mmserve-nocache", "transformers", "vllm"]
    head = ["workload", *(ENGINE_LABELS[e] for e in engines)]
    head += ["prefix hit rate", "encoder hit rate", "uncontended rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    zipf_notes = []
    for label, data in loaded:
        if data is None:
            continue
        by = {r["engine"]: r for r in data["rows"]}
        base = by.get("mmserve")
        cells = [label]
        for e in engines:
            row = by.get(e)
            if row is None:
                cells.append("–")
                continue
            ratio = row["req_per_s"] / base["req_per_s"] if base else None
            cells.append(spread_cell(row, "req_per_s") + (f" [{ratio:.2f}]" if ratio else ""))
        cells.append(f"{base['prefix_hit_rate']:.3g}" if base else "–")
        cells.append(f"{base['encoder_hit_rate']:.3g}" if base else "–")
        cells.append(rounds_cell(data["rows"]))
        lines.append("| " + " | ".join(cells) + " |")
        if "zipf" in label:
            ratios = [
                f"{ENGINE_LABELS.get(r['engine'], r['engine'])} {r['wall_over_limit']:.2f}"
                for r in data["rows"]
                if isinstance(r.get("wall_over_limit"), (int, float))
            ]
            limit = data.get("encode_once", {})
            zipf_notes.append(
                f"{label}: wall time / encode-once limit ({limit.get('limit_s', 0):.2f} s) = "
                + ", ".join(ratios)
            )
    lines.append("")
    lines.append(
        "Requests/s: median over the uncontended rounds (min-max), [ratio to mmserve]; hit "
        "rates of mmserve; uncontended rounds: the fewest of any engine (a round is contended "
        "when other processes took more than --max-others cores during it)."
    )
    lines += [f"- {n}" for n in zipf_notes]
    return "\n".join(lines)


def floor_lines(data: dict[str, Any]) -> str:
    flops, gemm = data["flops"], data["gemm"]
    head = (
        f"{flops['flops_per_request'] / 1e9:.2f} GFLOP per request (counted on transformers; "
        f"vision layers past the feature layer left out), fp32 GEMM "
        f"{gemm['gflops']:.0f} GFLOP/s on {data['args']['threads']} threads -> floor "
        f"{data['floor_req_per_s']:.1f} req/s. Time per request over the floor:"
    )
    cells = [
        f"{ENGINE_LABELS.get(r['engine'], r['engine'])} {r['time_over_floor']:.2f}x"
        for r in data.get("rows", [])
    ]
    return head + " " + ", ".join(cells) + "."


def probe_lines(out: Path, models: tuple[str, ...]) -> str:
    lines = []
    for model in models:
        files = sorted(out.glob(f"probe_{Path(model).name}_*.json"))
        if not files:
            continue
        rows = json.loads(files[0].read_text())["rows"]
        on = [r for r in rows if r["mode"] == "mmserve"]
        off = [r for r in rows if r["mode"] == "mmserve-nocache"]
        if not on or not off:
            continue
        n = min(len(on), len(off))
        lines.append(
            f"- {model}, {n} images: encoder time per turn {on[n - 1]['encoder_s']:.3f} s "
            f"with caches on vs {off[n - 1]['encoder_s']:.3f} s with caches off; TTFT "
            f"{on[0]['ttft_s']:.2f} -> {on[n - 1]['ttft_s']:.2f} s (on) vs "
            f"{off[0]['ttft_s']:.2f} -> {off[n - 1]['ttft_s']:.2f} s (off)"
        )
    return "\n".join(lines)


def serve_table(data: dict[str, Any]) -> str:
    rows = data["rows"]
    head = ["concurrency", "server", "req/s", "ratio", "TTFT p50 s", "TTFT p99 s", "ITL p50 s"]
    head += ["failed", "uncontended rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    str(r["concurrency"]),
                    ENGINE_LABELS.get(r["server"], r["server"]),
                    spread_cell(r, "req_per_s"),
                    f"{r['throughput_ratio']:.2f}",
                    spread_cell(r, "ttft_p50_s"),
                    spread_cell(r, "ttft_p99_s"),
                    spread_cell(r, "itl_p50_s"),
                    str(r["failed"]),
                    rounds_cell([r]),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def adversarial_table(out: Path) -> str | None:
    data = load_result(out, "adversarial_load.json")
    if data is None or not ADVERSARIAL.exists():
        return None
    spec = importlib.util.spec_from_file_location("adversarial_load", ADVERSARIAL)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.report(data["summary"]))


def render_tables(out: Path) -> str:
    """The README's result tables from the JSON files under ``out`` (missing ones skipped)."""
    parts: list[str] = []
    run = load_result(out, "all.json") or {}
    llava = run.get("args", {}).get("model", LLAVA)
    qwen = run.get("args", {}).get("qwen_model", QWEN)
    env = run.get("env", {})
    if env:
        prio = env.get("priority", {})
        parts.append(
            f"Measured {env.get('time', '?')} at {env.get('commit', '?')}, {env.get('threads')} "
            f"threads on {env.get('cpus')} CPUs, scheduling priority: "
            f"{prio.get('effective', '?')}"
            + (f" ({prio['reason']})" if prio.get("reason") else "")
            + f"; versions: {json.dumps(run.get('versions', {}))}; {run.get('rounds')} "
            "interleaved rounds, medians (min-max)."
        )
    for model, title in ((llava, "LLaVA"), (qwen, "Qwen2-VL")):
        for path in sorted(out.glob(f"multiturn_{Path(model).name}_*.json")):
            data = json.loads(path.read_text())
            args = data["args"]
            parts.append(
                f"### multiturn, {args['turns']} turns, {args['resolution']}, {model} "
                f"({title}; TTFT seconds)\n\n{multiturn_table(data)}"
            )
    reuse = [d for _, name in reuse_files(llava) if (d := load_result(out, name))]
    if reuse:
        args = reuse[0]["args"]
        parts.append(
            f"### reuse, {args['requests']} requests, {args['resolution']}, {llava} "
            f"(requests/s)\n\n{reuse_table(out, llava)}"
        )
    floor = load_result(out, f"floor_{Path(llava).name}.json")
    if floor:
        parts.append(f"### FLOP floor (reuse 0 %)\n\n{floor_lines(floor)}")
    probes = probe_lines(out, (llava, qwen))
    if probes:
        parts.append(f"### probe (one chat adding images)\n\n{probes}")
    for path in sorted(out.glob("serve_launch_*.json")):
        data = json.loads(path.read_text())
        args = data["args"]
        parts.append(
            f"### online serving ({args['requests']} requests per run, "
            f"{round(args['reuse'] * 100)} % reuse {args['order']}, {args['resolution']})\n\n"
            f"{serve_table(data)}"
        )
    parts.append(f"### issue 14 targets (this run)\n\n{targets_table(out, llava, qwen)}")
    adversarial = adversarial_table(out)
    if adversarial:
        parts.append(f"### adversarial load\n\n{adversarial}")
    return "\n\n".join(parts) + "\n"
