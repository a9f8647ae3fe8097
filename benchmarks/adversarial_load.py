"""Can one abusive client hurt everyone else on an ``mmserve serve`` server?

Starts the server (127.0.0.1, a free port), then per scenario (idle first, then each attack) and
per round measures for ``--window`` seconds: /health latency (open loop, one GET every 20 ms;
failures count as the timeout), K streaming text-only victims (TTFT, inter-token latency) and an
unrelated small chat every 0.5 s (end-to-end). Attackers run in a separate, niced process with
bodies built before the window, so their client-side work cannot stall the measuring loop.
Requests still open when the window closes are cancelled and counted as censored samples (their
elapsed time is a lower bound). Attack scenarios: many_parts, uploads_4k, drip_urls, stop_strings.

    python benchmarks/adversarial_load.py --window 8 --rounds 3 \
        --server-arg='--allowed-media-networks 127.0.0.1/32'
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing as mp
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from mmserve.bench.lib.priority import add_priority_arg, apply_priority

ATTACKERS = {"many_parts": 2, "uploads_4k": 2, "drip_urls": 16, "stop_strings": 2}
CHAT = "/v1/chat/completions"
JSON_HDR = {"content-type": "application/json"}
HEALTH_TARGET_S = 0.050


def chat(model: str, content: Any, max_tokens: int, stream: bool = False, **kw: Any) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **kw,
    }


def pct(xs: list[float], q: float) -> float | None:
    """Percentile in ms (None without samples)."""
    return 1e3 * float(np.percentile(xs, q)) if xs else None


# ----------------------------------------------------------------------- attackers (child process)
class Drip(BaseHTTPRequestHandler):
    """Headers promising 10 MB, then 1 byte every 0.5 s (for at most 60 s)."""

    def do_GET(self) -> None:  # noqa: N802
        self.server.hits += 1  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(10 << 20))
        self.end_headers()
        try:
            for _ in range(120):
                self.wfile.write(b"\x89")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


def noisy_jpeg() -> bytes:
    """3840x2160 gradient + Gaussian noise (sigma 12), JPEG quality 90: about 3 MB."""
    rng = np.random.default_rng(0)
    y = np.linspace(0, 255, 2160, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, 3840, dtype=np.float32)[None, :, None]
    base = (0.5 * y + 0.5 * x) * np.array([1.0, 0.6, 0.3], dtype=np.float32)
    arr = np.clip(base + rng.normal(0, 12, base.shape[:2] + (3,)), 0, 255).astype(np.uint8)
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def attack_bodies(scenario: str, model: str, drip_port: int) -> Any:
    """A function attacker i, request j -> encoded body; heavy bodies are built once here."""
    if scenario == "many_parts":
        parts = [{"type": "text", "text": "lorem ip"}] * 65536
        body = json.dumps(chat(model, parts, 1), separators=(",", ":")).encode()
    elif scenario == "uploads_4k":
        import base64

        jpeg = noisy_jpeg()
        jpeg += b"\0" * (-len(jpeg) % 3)  # base64(jpeg + tail) == base64(jpeg) + base64(tail)
        head, tail = json.dumps(
            chat(model, [{"type": "image_url", "image_url": {"url": "@"}}, "Describe."], 1)
        ).split('"@"')
        prefix = (head + '"data:image/jpeg;base64,' + base64.b64encode(jpeg).decode()).encode()
        tail = tail.replace('"Describe."', '{"type": "text", "text": "Describe."}')

        def upload(i: int, j: int) -> bytes:
            """Bytes differ per request (a trailer after the JPEG's end marker, which decoders
            ignore), so no admission memo can skip the decode."""
            unique = base64.b64encode(f"{i:04d}{j:08d}".encode()).decode()
            return prefix + unique.encode() + b'"' + tail.encode()

        return upload
    elif scenario == "stop_strings":
        letters = np.random.default_rng(1).integers(97, 123, (300_000, 8), dtype=np.uint8)
        stops = [row.tobytes().decode() for row in letters]
        body = json.dumps(chat(model, "Tell me a story.", 64, True, stop=stops)).encode()
    else:  # drip_urls: a fresh URL per request (tiny body)

        def drip(i: int, j: int) -> bytes:
            url = f"http://127.0.0.1:{drip_port}/img/{i}-{j}.png"
            content = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is this?"},
            ]
            return json.dumps(chat(model, content, 1)).encode()

        return drip
    return lambda i, j: body


async def attack(base_url: str, make: Any, n: int, seconds: float, tally: Counter) -> None:
    deadline = time.perf_counter() + seconds
    timeout = httpx.Timeout(60.0, connect=5.0)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=timeout, trust_env=False, limits=httpx.Limits(max_connections=n)
    ) as client:

        async def one(i: int) -> None:
            j = 0
            while time.perf_counter() < deadline:
                j += 1
                try:
                    async with client.stream(
                        "POST", CHAT, content=make(i, j), headers=JSON_HDR
                    ) as resp:
                        async for _ in resp.aiter_raw():
                            pass
                    tally[str(resp.status_code)] += 1
                except httpx.TimeoutException:
                    tally["timeout"] += 1
                except httpx.HTTPError as exc:
                    tally[type(exc).__name__] += 1
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for task in pending:
            task.cancel()
        tally["in_flight_at_end"] += len(pending)
        await asyncio.gather(*tasks, return_exceptions=True)


def attacker_main(
    scenario: str, base_url: str, model: str, seconds: float, ready: Any, go: Any, out: Any
) -> None:
    os.nice(5)  # the server and the measuring process get the CPU first
    drip = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    drip.daemon_threads, drip.hits = True, 0  # type: ignore[attr-defined]
    threading.Thread(target=drip.serve_forever, daemon=True).start()
    make = attack_bodies(scenario, model, drip.server_address[1])
    info = {"body_bytes": len(make(0, 0))}
    if scenario == "uploads_4k":
        info["image"] = "3840x2160 JPEG q90 (gradient + noise), distinct bytes per request"
    ready.set()
    if not go.wait(120):  # the measuring side never started: do not attack
        return
    tally: Counter = Counter()
    asyncio.run(attack(base_url, make, ATTACKERS[scenario], seconds, tally))
    if scenario == "drip_urls":
        info["drip_fetches"] = drip.hits  # type: ignore[attr-defined]
    out.put({"tally": dict(tally), **info})


# ----------------------------------------------------------------------- measuring (main process)
async def measure(base_url: str, model: str, args: argparse.Namespace, go: Any) -> dict:
    health: list[float] = []
    ttft: list[float] = []
    itl: list[float] = []
    unrelated: list[float] = []
    lag: list[float] = []
    n: Counter = Counter()
    victim = json.dumps(chat(model, "Write a long story about a lighthouse.", 64, True)).encode()
    small = json.dumps(chat(model, "Say hi.", 4)).encode()

    def pool(conns: int) -> httpx.AsyncClient:  # one pool per kind: no queueing behind another
        limits = httpx.Limits(max_connections=conns)
        return httpx.AsyncClient(base_url=base_url, trust_env=False, timeout=30.0, limits=limits)

    async with pool(32) as hc, pool(16) as uc, pool(args.victims) as vc:

        async def timed(req: Any, xs: list[float], label: str, fail: float | None) -> None:
            """One request; latency on success. ``fail``: total timeout, and the latency recorded
            for a timeout or any other failure."""
            t0 = time.perf_counter()
            try:
                r = await asyncio.wait_for(req(), fail)
                n[f"{label}_{r.status_code}"] += 1
                ok = r.status_code == 200
            except (httpx.HTTPError, asyncio.TimeoutError) as exc:
                n[f"{label}_{type(exc).__name__}"] += 1
                ok = False
            except asyncio.CancelledError:  # still open at the end: a lower bound
                xs.append(time.perf_counter() - t0)
                n[f"{label}_censored"] += 1
                raise
            xs.append(fail if fail is not None and not ok else time.perf_counter() - t0)

        def health_once() -> Any:
            return timed(lambda: hc.get("/health"), health, "health", args.health_timeout)

        def unrelated_once() -> Any:
            post = lambda: uc.post(CHAT, content=small, headers=JSON_HDR)  # noqa: E731
            return timed(post, unrelated, "unrelated", None)

        async def every(period: float, fn: Any, spawned: list[asyncio.Task]) -> None:
            t0 = time.perf_counter()
            for k in range(int(args.window / period) + 1):
                await asyncio.sleep(max(0.0, t0 + k * period - time.perf_counter()))
                spawned.append(asyncio.create_task(fn()))

        async def victim_loop() -> None:
            while True:
                t0 = time.perf_counter()
                last = None
                try:
                    async with vc.stream("POST", CHAT, content=victim, headers=JSON_HDR) as r:
                        async for line in r.aiter_lines():
                            if not line.startswith("data:") or "[DONE]" in line:
                                continue
                            chunk = json.loads(line[5:])
                            if not any(
                                (c.get("delta") or {}).get("content")
                                for c in chunk.get("choices") or []
                            ):
                                continue
                            now = time.perf_counter()
                            (ttft if last is None else itl).append(now - (last or t0))
                            last = now
                    n[f"victim_{r.status_code}"] += 1
                    ok = r.status_code == 200
                except httpx.HTTPError as exc:
                    n[f"victim_{type(exc).__name__}"] += 1
                    ok = False
                except asyncio.CancelledError:  # open gap / wait for the first token
                    (ttft if last is None else itl).append(time.perf_counter() - (last or t0))
                    n["victim_censored"] += 1
                    raise
                if not ok:  # no hot loop against a failing server
                    await asyncio.sleep(0.1)

        async def lag_monitor() -> None:  # client event-loop stalls (should stay ~0)
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                lag.append(time.perf_counter() - t0 - 0.01)

        spawned: list[asyncio.Task] = []
        go.set()
        await asyncio.sleep(args.ramp)
        tasks = [asyncio.create_task(victim_loop()) for _ in range(args.victims)]
        tasks += [
            asyncio.create_task(every(0.02, health_once, spawned)),
            asyncio.create_task(every(0.5, unrelated_once, spawned)),
            asyncio.create_task(lag_monitor()),
        ]
        await asyncio.sleep(args.window)
        for task in tasks + spawned:
            task.cancel()
        await asyncio.gather(*tasks, *spawned, return_exceptions=True)
    row: dict[str, Any] = dict(n)
    for name, xs in (("health", health), ("itl", itl), ("ttft", ttft), ("unrelated", unrelated)):
        row[f"{name}_n"] = len(xs)
        row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = (pct(xs, 50), pct(xs, 99))
    row["health_max_ms"] = 1e3 * max(health) if health else None
    row["client_loop_lag_max_ms"] = 1e3 * max(lag) if lag else None
    return row


def settle(base_url: str, model: str, limit_s: float) -> float:
    """Wait until 5 /health in a row answer < 50 ms and a small chat succeeds (bounded)."""
    t0, streak = time.perf_counter(), 0
    body = chat(model, "Say hi.", 4)
    with httpx.Client(base_url=base_url, trust_env=False, timeout=5.0) as c:
        while time.perf_counter() - t0 < limit_s:
            try:
                s = time.perf_counter()
                ok = c.get("/health").status_code == 200 and time.perf_counter() - s < 0.05
                streak = streak + 1 if ok else 0
                if streak >= 5 and c.post(CHAT, json=body).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                streak = 0
            time.sleep(0.05)
    return -1.0


def run_scenario(name: str, base_url: str, args: argparse.Namespace) -> dict:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    proc, info = None, {}
    if name != "idle":
        ready, q = ctx.Event(), ctx.Queue()
        proc = ctx.Process(
            target=attacker_main,
            daemon=True,
            args=(name, base_url, args.model, args.ramp + args.window, ready, go, q),
        )
        proc.start()
    try:
        if proc is not None and not ready.wait(120):
            raise RuntimeError(f"{name}: attacker process did not get ready")
        row = asyncio.run(measure(base_url, args.model, args, go))
        if proc is not None:
            try:
                info = q.get(timeout=15)
            except Exception:
                info = {"tally": {"attacker_process_no_report": 1}}
    finally:
        if proc is not None:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    row["settle_s"] = settle(base_url, args.model, args.settle)
    return {**row, **info}


# ----------------------------------------------------------------------- server and report
def start_server(args: argparse.Namespace, log: Any) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = [a for arg in args.server_arg for a in shlex.split(arg)]
    cmd = [sys.executable, "-m", "mmserve.cli", "serve", "--model", args.model]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    if args.server_src:  # e.g. a `git archive` export of another commit
        env["PYTHONPATH"] = str(Path(args.server_src).resolve())
    print("server:", shlex.join(cmd), f"(source: {args.server_src or 'installed'})", flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=args.server_src, stdout=log, stderr=subprocess.STDOUT)
    base_url, t0 = f"http://127.0.0.1:{port}", time.perf_counter()
    while time.perf_counter() - t0 < 180:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}, log: {log.name}")
        try:
            if httpx.get(base_url + "/health", timeout=1.0, trust_env=False).status_code == 200:
                return proc, base_url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after 180 s, log: {log.name}")


def median_row(runs: list[dict]) -> dict[str, Any]:
    """Medians over rounds (a latency without samples counts as infinite), tallies summed."""
    med: dict[str, Any] = {
        "tally": dict(sum((Counter(r.get("tally", {})) for r in runs), Counter()))
    }
    for key in dict.fromkeys(k for r in runs for k in r):
        vals = [r.get(key) for r in runs]
        if key.endswith("_ms"):
            m = float(np.median([np.inf if v is None else v for v in vals]))
            med[key] = None if np.isinf(m) else m
        elif all(isinstance(v, (int, float)) or v is None for v in vals):  # counts
            med[key] = float(np.median([v or 0 for v in vals]))
        elif key != "tally":
            med[key] = vals[0] if len({str(v) for v in vals}) == 1 else vals
    return med


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def report(summary: dict[str, dict]) -> str:
    idle_itl = summary.get("idle", {}).get("itl_p99_ms")
    head = (
        "| scenario | /health p50 / p99 / max ms | ITL p50 / p99 ms (x idle) | TTFT p50 / p99 ms |"
        " unrelated p50 / p99 ms | attacker outcomes | /health p99 <= 50 ms | ITL p99 <= 2x idle |"
        "\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, r in summary.items():
        if "health_p99_ms" not in r:
            lines.append(f"| {name} | failed: {r.get('error')} |")
            continue
        h99, i99 = r["health_p99_ms"], r["itl_p99_ms"]
        ratio = i99 / idle_itl if i99 is not None and idle_itl else None
        lines.append(
            f"| {name} | {fmt(r['health_p50_ms'])} / {fmt(h99)} / {fmt(r['health_max_ms'])} "
            f"| {fmt(r['itl_p50_ms'])} / {fmt(i99)} "
            f"({'no tokens' if ratio is None else f'{ratio:.2f}x'}) "
            f"| {fmt(r['ttft_p50_ms'])} / {fmt(r['ttft_p99_ms'])} "
            f"| {fmt(r['unrelated_p50_ms'])} / {fmt(r['unrelated_p99_ms'])} "
            f"| {', '.join(f'{k}: {v}' for k, v in sorted(r['tally'].items())) or '–'} "
            f"| {'PASS' if h99 is not None and h99 <= 1e3 * HEALTH_TARGET_S else 'FAIL'} "
            f"| {'PASS' if ratio is not None and ratio <= 2 else 'FAIL'} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="tiny-llava-small")
    p.add_argument("--window", type=float, default=8.0, help="measured seconds per scenario")
    p.add_argument("--ramp", type=float, default=1.0, help="attack-only seconds before measuring")
    p.add_argument("--rounds", type=int, default=1, help="repeat all scenarios; report medians")
    p.add_argument("--scenarios", default="idle," + ",".join(ATTACKERS))
    p.add_argument("--server-arg", action="append", default=[], help="shell-split serve flags")
    p.add_argument("--server-src", default=None, help="run the server from this source tree")
    p.add_argument("--threads", type=int, default=2, help="OMP/MKL threads of the server")
    p.add_argument("--victims", type=int, default=4)
    p.add_argument("--health-timeout", type=float, default=2.0)
    p.add_argument("--settle", type=float, default=45.0, help="max recovery wait per scenario")
    p.add_argument("--out", default="benchmarks/results/adversarial_load.json")
    add_priority_arg(p)
    args = p.parse_args()
    names = [s for s in args.scenarios.split(",") if s]
    unknown = set(names) - {"idle", *ATTACKERS}
    if unknown:
        p.error(f"unknown scenarios: {sorted(unknown)}")
    names = ["idle"] + [s for s in names if s != "idle"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below
    priority = apply_priority(args)  # autogroup (server and attackers too) + process nice
    log = tempfile.NamedTemporaryFile("w", prefix="mmserve-adv-", suffix=".log", delete=False)
    proc, base_url = None, ""
    rounds: list[dict[str, dict]] = []
    try:
        proc, base_url = start_server(args, log)
        settle(base_url, args.model, args.settle)  # warm-up: first requests pay one-off costs
        for _ in range(2):
            httpx.post(
                base_url + CHAT, json=chat(args.model, "Hi", 16), timeout=60, trust_env=False
            )
        for k in range(args.rounds):
            rounds.append({})
            for name in names:
                print(f"round {k + 1}/{args.rounds}: {name} ...", flush=True)
                try:
                    rounds[-1][name] = run_scenario(name, base_url, args)
                except Exception as exc:  # recorded; the other scenarios still run
                    print(f"  {name} failed: {exc!r}", flush=True)
                    rounds[-1][name] = {"error": repr(exc)}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()
    summary = {name: median_row([r[name] for r in rounds if name in r]) for name in names}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "attackers": ATTACKERS, "cpu_count": os.cpu_count()}
    meta["priority"] = priority
    meta |= {"server_log": log.name, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    out.write_text(json.dumps({"meta": meta, "summary": summary, "rounds": rounds}, indent=1))
    print(report(summary))
    print(f"results: {out}; server log: {log.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
