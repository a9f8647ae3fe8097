"""Smoke tests of the ``mmserve bench`` workloads on tiny-llava with tiny sizes (seconds)."""

from __future__ import annotations

import argparse
import json

import httpx

from mmserve.bench import floor, probe
from mmserve.bench.all import run as bench_all
from mmserve.bench.cli import add_bench_parser
from mmserve.bench.lib.workloads import percentile, reuse_specs, zipf_specs
from mmserve.bench.multiturn import run as multiturn
from mmserve.bench.reuse import run as reuse
from mmserve.bench.serve import run as serve
from mmserve.bench.serve.client import parse_sse_line

MODEL = ["--model", "tiny-llava", "--resolution", "480p", "--threads", "2", "--no-raise-priority"]
# The workloads that time interleaved rounds run a contended round (another process took over
# half a core meanwhile: on CI, the other test worker) up to twice more by default; these tests
# check what the runs count and answer, not their timings, so one run each is enough (the retry
# itself: tests/bench/test_bench_harness.py).
ONE_TRY = ["--retries", "0"]


def test_multiturn(tmp_path):
    out = multiturn.main(
        [
            *MODEL,
            *ONE_TRY,
            "--turns",
            "2",
            "--answer-tokens",
            "3",
            "--out",
            str(tmp_path),
            "--engines",
            "mmserve,mmserve-nocache,transformers",
        ]
    )
    saved = json.loads((tmp_path / "multiturn_tiny-llava_480p.json").read_text())
    assert (tmp_path / "multiturn_tiny-llava_480p.json").exists()
    summary = {s["engine"]: s for s in saved["summary"]}
    assert summary["mmserve"]["images_encoded"] == 2  # each distinct image encoded once
    assert summary["mmserve"]["embeddings_computed/distinct"] == 1.0
    assert summary["mmserve-nocache"]["images_encoded"] == 3  # 1 + 2
    assert all(s["same_tokens_as_first"] for s in saved["summary"])
    turn2 = [r for r in out["rows"] if r["turn"] == 2]
    assert {r["prompt_tokens"] for r in turn2} == {turn2[0]["prompt_tokens"]}
    assert next(r for r in turn2 if r["engine"] == "mmserve")["cached_tokens"] > 0
    assert all(r["ttft_s"] > 0 and len(r["token_ids"]) == 3 for r in out["rows"])


def test_reuse_shared_prefixes(tmp_path):
    # sequential: a repeat's prefix blocks are computed before it arrives, so it can hit them
    out = reuse.main(
        [
            *MODEL,
            *ONE_TRY,
            "--requests",
            "6",
            "--reuse",
            "0.5",
            "--max-tokens",
            "3",
            "--arrival",
            "sequential",
            "--engines",
            "mmserve,mmserve-nocache",
            "--out",
            str(tmp_path),
        ]
    )
    assert list(tmp_path.glob("reuse_tiny-llava_50pct_grouped_sequential.json"))
    specs = reuse_specs(6, 0.5, grouped=True)
    distinct = len({s.image for s in specs})
    on, off = out["rows"]
    assert on["images_encoded"] == distinct
    assert on["prefix_hit_rate"] > 0 and off["prefix_hit_rate"] == 0
    assert out["identical"] and on["req_per_s"] > 0 and on["ttft_p99_s"] >= on["ttft_p50_s"]


def test_reuse_zipf(tmp_path):
    out = reuse.main(
        [
            *MODEL,
            *ONE_TRY,
            "--requests",
            "6",
            "--zipf",
            "--distinct",
            "3",
            "--max-tokens",
            "2",
            "--engines",
            "mmserve",
            "--out",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / "reuse_tiny-llava_zipf_D3_all.json").read_text())
    (row,) = saved["rows"]
    assert row["images_encoded"] == saved["distinct_images"]
    assert row["prefix_hit_rate"] == 0  # every request has its own prefix
    limit = saved["encode_once"]
    assert limit["limit_s"] >= limit["floor_s"] > 0 and row["wall_over_limit"] > 0
    assert out["identical"]


def test_probe(tmp_path):
    out = probe.main(
        [
            *MODEL,
            "--max-images",
            "3",
            "--answer-tokens",
            "2",
            "--no-mallopt",
            "--out",
            str(tmp_path),
        ]
    )
    assert (tmp_path / "probe_tiny-llava_480p.json").exists()
    on = [r for r in out["rows"] if r["mode"] == "mmserve"]
    off = [r for r in out["rows"] if r["mode"] == "mmserve-nocache"]
    assert [r["images_encoded"] for r in on] == [1, 1, 1]
    assert [r["images_encoded"] for r in off] == [1, 2, 3]
    assert on[-1]["encoder_cache_mib"] > 0 and off[-1]["encoder_cache_mib"] == 0


def _sse_stub(request: httpx.Request) -> httpx.Response:
    """An OpenAI-style streaming chat endpoint: three content deltas, usage, [DONE]."""
    if request.url.path.endswith("/models"):
        return httpx.Response(200, json={"data": [{"id": "stub"}]})
    if request.url.path.endswith("/metrics"):
        return httpx.Response(404)
    body = json.loads(request.content)
    assert body["stream"] and body["model"] == "stub"
    assert body["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png")
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in ("a", " b", " c")]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 3}})
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


def test_serve_client_against_stub(tmp_path):
    argv = [
        "--requests",
        "5",
        "--concurrency",
        "2",
        "--resolution",
        "480p",
        "--run",
        "1",
        "--out",
        str(tmp_path),
        "--no-raise-priority",
    ]
    out = serve.main(argv, transport=httpx.MockTransport(_sse_stub))
    summary = out["summary"]
    assert summary["requests"] == 5 and summary["failed"] == 0
    assert summary["out_tok_per_s"] > 0 and summary["ttft_p50_s"] > 0
    assert all(r["text"] == "a b c" and len(r["itl_s"]) == 2 for r in out["results"])
    assert (tmp_path / "serve_c2_30pct_shuffled.json").exists()


def test_bench_all_quick_subset(tmp_path):
    """`mmserve bench all` end to end on a subset: sections run as child processes, then the
    tables are rendered from their JSON."""
    out = bench_all.main(
        [
            "--only",
            "reuse-0,multiturn-llava",
            "--quick",
            "--model",
            "tiny-llava",
            "--resolution",
            "480p",
            "--threads",
            "2",
            "--out",
            str(tmp_path),
            "--no-raise-priority",
            *ONE_TRY,
        ]
    )
    assert out["failed"] == [], (tmp_path / "logs").glob("*.log")
    text = (tmp_path / "tables.md").read_text()
    assert "| 0 % reuse | " in text and "### multiturn, 2 turns, 480p, tiny-llava" in text
    saved = json.loads((tmp_path / "reuse_tiny-llava_0pct_grouped_all.json").read_text())
    assert saved["env"]["priority"]["requested"] is False
    assert [e for r, e in saved["round_order"] if r == 1][0] == "mmserve-prefix-off"
    row = saved["rows"][0]
    assert row["rounds"] == 2 and row["req_per_s_min"] <= row["req_per_s"] <= row["req_per_s_max"]
    assert saved["versions"]["torch"] and saved["threads"]["threads"] == 2


def test_floor(tmp_path):
    reuse_json = tmp_path / "reuse.json"
    reuse_json.write_text(json.dumps({"rows": [{"engine": "mmserve", "req_per_s": 2.0}]}))
    out = floor.main(
        [*MODEL, "--gemm-seconds", "0.2", "--out", str(tmp_path), "--reuse-json", str(reuse_json)]
    )
    flops = out["flops"]
    assert flops["flops_per_request"] > 0 and flops["prompt_tokens"] > 0
    assert 0 < flops["flops_skippable_vision_layers"] < flops["flops_vision"]  # LLaVA layer -2
    assert out["gemm"]["gflops"] > 0
    (row,) = out["rows"]
    assert row["time_over_floor"] == out["floor_req_per_s"] / 2.0
    assert (tmp_path / "floor_tiny-llava.json").exists()


def test_serve_launch_starts_and_stops_the_server(tmp_path):
    out = serve.main(
        [
            "--launch",
            "mmserve",
            "--model",
            "tiny-llava",
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--warmup-requests",
            "1",
            "--resolution",
            "480p",
            "--threads",
            "2",
            "--out",
            str(tmp_path),
            "--no-raise-priority",
            *ONE_TRY,
            # media decoding in server threads: the server is healthy without first waiting for
            # a niced media worker process to import torch (minutes while the other test worker
            # keeps both cores busy); this test is about the launch, not the media workers
            "--server-arg=--media-workers 0",
        ]
    )
    (row,) = out["rows"]
    assert row["server"] == "mmserve" and row["failed"] == 0 and row["req_per_s"] > 0
    assert row["rounds"] == 1 and row["throughput_ratio"] == 1.0
    saved = json.loads((tmp_path / "serve_launch_tiny-llava_30pct_shuffled.json").read_text())
    assert saved["server_start_s"]["mmserve"][0] > 0
    assert (tmp_path / "serve_logs" / "mmserve_round0.log").exists()


def test_sse_parsing_and_helpers():
    assert parse_sse_line("data: [DONE]") is None
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line('data: {"x": 1}') == {"x": 1}
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == 2.0
    specs = zipf_specs(200, 10, seed=0)
    counts = [sum(s.image == k for s in specs) for k in range(10)]
    assert counts[0] > counts[9] and len({s.prefix for s in specs}) == 200


def test_cli_routes_options_to_the_workload():
    parser = argparse.ArgumentParser(prog="mmserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "reuse", "--requests", "3", "--zipf"])
    assert args.workload == "reuse" and args.workload_args == ["--requests", "3", "--zipf"]
