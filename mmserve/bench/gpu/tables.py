"""A GPU run's records as markdown, with each number beside its limit (stdlib only).

Limits, from the ``limits`` stage and the checkpoint's parameter counts (in the dtype the
bench stage ran): decode at batch B reads the language model's weights once per step, so
``B x bandwidth / weight bytes`` tokens/s, and cannot beat ``matmul rate / (2 x params)``;
prefill of P prompt tokens takes at least ``2 x params x P / matmul rate`` (the language
model's matmuls only: vision tower and attention left out, so the floor is optimistic).
"""

from __future__ import annotations

import re
from itertools import zip_longest
from typing import Any

BYTES_PER_PARAM = {"bfloat16": 2, "float16": 2, "float32": 4}
DECODE_KEY = re.compile(r"decode_b(\d+)(_eager)?_tok_s")  # with decode graphs, or without


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if isinstance(value, (int, float)) else "–"


def count_text(n: int) -> str:
    return f"{n / 1e9:.3g} B" if n >= 1e8 else f"{n / 1e6:.3g} M"


def limits_of(bench: dict[str, Any], limits: dict[str, Any] | None) -> dict[str, float]:
    """Per metric of ``bench`` (a bench stage's result) its limit, where ``limits`` allow."""
    if not limits:
        return {}
    lm = bench["lm_params"]
    bandwidth = limits["bandwidth_gb_s"] * 1e9
    rate = limits["bf16_matmul_tflop_s"] * 1e12
    out: dict[str, float] = {}
    for key in bench["mmserve"]:
        decode = DECODE_KEY.fullmatch(key)
        if decode:
            batch = int(decode.group(1))
            out[key] = min(
                batch * bandwidth / (BYTES_PER_PARAM[bench["dtype"]] * lm), rate / (2 * lm)
            )
    prompt = bench["mmserve"].get("prompt_tokens_one_image")
    if prompt:
        out["ttft_s"] = 2 * lm * prompt / rate
    return out


ROWS = [  # (key, label, lower is better)
    ("load_s", "load to first token (s)", True),
    ("ttft_s", "TTFT, one new image (s)", True),
]


def bench_rows(bench: dict[str, Any], limits: dict[str, Any] | None) -> list[str]:
    """Markdown rows: metric | mmserve | transformers | mmserve vs transformers | limit |
    mmserve at % of limit."""
    ours, theirs = bench["mmserve"], bench.get("transformers", {})
    bounds = limits_of(bench, limits)
    rows = list(ROWS)
    rows += [(k, _decode_label(k), False) for k in ours if DECODE_KEY.fullmatch(k)]
    rows += [
        (k, f"throughput req/s, {k.split('_')[1]} % image reuse", False)
        for k in ours
        if k.startswith("reuse_") and k.endswith("_req_s")
    ]
    lines = []
    for key, label, lower in rows:
        a, b, bound = ours.get(key), theirs.get(key), bounds.get(key)
        speedup = (b / a if lower else a / b) if a and b else None
        of_limit = (bound / a if lower else a / bound) if a and bound else None
        lines.append(
            f"| {label} | {_num(a)} | {_num(b)} | {_num(speedup)}x | {_num(bound)} | "
            f"{_num(of_limit * 100 if of_limit else None)} |"
        )
    for key, label in (("multiturn_ttft_s", "multi-turn TTFT"),
                       ("followup_ttft_s", "chat about one image, TTFT")):  # fmt: skip
        turns = zip_longest(ours.get(key, []), theirs.get(key, []))
        for turn, (a, b) in enumerate(turns, start=1):
            lines.append(
                f"| {label}, turn {turn} (s) | {_num(a)} | {_num(b)} | "
                f"{_num(b / a if a and b else None)}x | – | – |"
            )
    return lines


def _decode_label(key: str) -> str:
    decode = DECODE_KEY.fullmatch(key)
    assert decode is not None
    eager = ", eager (no decode graphs)" if decode.group(2) else ""
    return f"decode tok/s, batch {decode.group(1)}{eager}"


def graphs_line(bench: dict[str, Any]) -> str:
    """What mmserve's decode numbers ran on (``measure.graph_record``)."""
    g = bench["mmserve"].get("cuda_graphs")
    if not g:
        return "Decode graphs: not recorded."
    if g["mode"] == "off":
        return (
            "Decode graphs: off (none, or their capture failed: see gpu.log); decode ran eagerly."
        )
    if g["mode"] == "captured":
        how = f"{g['graphs']} CUDA graphs, captured in {g['capture_s']:.2f} s,"
    else:
        how = "the padded static-shape path (no capture off CUDA)"
    return (
        f"Decode graphs: {how} ran {g['decode_steps']} decode steps of the decode rows;"
        " the eager rows turn them off on the same engine."
    )


def render(results: dict[str, Any]) -> str:
    """The run's markdown: where and what, stages, limits, parity, one table per model."""
    stages = results["stages"]
    by_name = {s["name"]: s for s in stages}
    env = by_name.get("env", {}).get("result") or {}
    limits = by_name.get("limits", {}).get("result")
    versions = env.get("versions", {})
    lines = [
        f"# mmserve GPU run ({results['mode']})",
        "",
        f"{env.get('device_name', results['device'])}, torch {versions.get('torch', '?')}, "
        f"transformers {versions.get('transformers', '?')}, commit "
        f"{versions.get('mmserve_commit', '?')}, {results['started']}, "
        f"{results['seconds']:.0f} s in all.",
        "",
        "| stage | status | seconds | note |",
        "|---|---|---|---|",
    ]
    for s in stages:
        note = (s.get("error") or "").replace("|", "/").replace("\n", " ")[:100]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {note} |")
    if limits:
        lines += [
            "",
            f"Measured limits: copy bandwidth {_num(limits['bandwidth_gb_s'], 4)} GB/s "
            f"(read + write), bfloat16 matmul {_num(limits['bf16_matmul_tflop_s'], 4)} "
            f"TFLOP/s ({limits['matmul_size']}-square).",
        ]
    parity = [s for s in stages if s["kind"] == "parity" and s["status"] == "ok"]
    if parity:
        lines += [
            "",
            "| parity | float32 token-identical | bfloat16 close | equal prefix f32 / bf16 "
            "| decode graphs | graphs = eager: f32 identical / bf16 close |",
            "|---|---|---|---|---|---|",
        ]
        for s in parity:
            r = s["result"]
            f32, bf16 = r["float32"], r["bfloat16"]
            g32, g16 = f32.get("graphs", {}), bf16.get("graphs", {})
            lines.append(
                f"| {s['model']} | {f32['identical']} | {bf16['close']} | "
                f"{f32['equal_prefix']} / {bf16['equal_prefix']} of {r['tokens']} | "
                f"{g32.get('mode', '–')} ({g32.get('steps', 0)} steps) | "
                f"{g32.get('identical_to_eager', '–')} / {g16.get('close_to_eager', '–')} |"
            )
    for s in stages:
        if s["kind"] == "bench" and s["status"] == "ok":
            r = s["result"]
            lines += [
                "",
                f"### {s['model']} ({r['dtype']}, {count_text(r['params'])} parameters)",
                "",
                "| metric | mmserve | transformers | mmserve vs "
                "transformers | limit | mmserve at % of limit |",
                "|---|---|---|---|---|---|",
                *bench_rows(r, limits),
                "",
                graphs_line(r),
            ]
    for s in stages:
        if s["kind"] == "profile" and s["status"] == "ok":
            lines += ["", *profile_lines(s["model"], s["result"])]
    return "\n".join(lines) + "\n"


def profile_lines(model: str, r: dict[str, Any]) -> list[str]:
    """A profile stage's table: per part its wall time, host syncs and top operators."""
    parts: list[str] = [k for k in ("decode_b1_eager", "decode_b1_graphs") if k in r]
    parts += [k for k in r if k.startswith("chat_turn") and isinstance(r[k], dict)]
    lines = [
        f"### Profile of {model} (`torch.profiler`; decode parts: {r['decode_steps']} steps)",
        "",
        "| part | wall, s | per step, s | host syncs | top self CPU, ms | top self device, ms |",
        "|---|---|---|---|---|---|",
    ]
    for part in parts:
        p = r[part]
        syncs = ", ".join(f"{k} {v}" for k, v in p["syncs"].items()) or "–"
        lines.append(
            f"| {part} | {_num(p['wall_s'])} | {_num(p['wall_per_step_s'])} | {syncs} | "
            f"{_ops(p['top_cpu'])} | {_ops(p['top_device'])} |"
        )
    turns = ", ".join(
        f"{t['turn']}: {_num(t['ttft_s'])} s ({t['cached_tokens']}/{t['prompt_tokens']} cached)"
        for t in r.get("chat_turns", [])
    )
    return [*lines, "", f"Chat TTFT by turn, a new image each turn: {turns}."]


def _ops(top: list[dict[str, Any]]) -> str:
    return "; ".join(f"{o['op']} x{o['calls']} {_num(o['ms'])}" for o in top[:5]) or "–"


def summary(results: dict[str, Any]) -> str:
    """A few lines for the console: stage statuses and each model's headline numbers."""
    stages = results["stages"]
    marks = ", ".join(f"{s['name']} {s['status']}" for s in stages)
    lines = [f"gpu run ({results['mode']}, {results['seconds']:.0f} s): {marks}"]
    for s in stages:
        if s["kind"] == "parity" and s["status"] == "ok":
            r = s["result"]
            lines.append(
                f"  parity {s['model']}: float32 identical {r['float32']['identical']}, "
                f"bfloat16 close {r['bfloat16']['close']}"
            )
        if s["kind"] == "bench" and s["status"] == "ok":
            m, t = s["result"]["mmserve"], s["result"]["transformers"]
            decode = ", ".join(
                f"b{d[1]}{' eager' if d[2] else ''} {_num(m[k])} ({_num(t.get(k))})"
                for k in m
                if (d := DECODE_KEY.fullmatch(k))
            )
            lines.append(
                f"  {s['model']}: load {_num(m['load_s'])} s ({_num(t['load_s'])}), "
                f"TTFT {_num(m['ttft_s'])} s ({_num(t['ttft_s'])}), decode tok/s "
                f"{decode}; transformers in parentheses"
            )
        if s["status"] != "ok":
            lines.append(f"  {s['name']}: {s['status']}: {(s.get('error') or '')[:160]}")
    return "\n".join(lines)
