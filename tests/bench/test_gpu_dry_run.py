"""The GPU run's script in its CPU dry run (``benchmarks/gpu/run.sh --dry-run``): the same
stages and outputs as on the GPU, with tiny presets, so the script cannot rot between GPU
windows (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmserve.bench.gpu.plan import DRY_RUN, stages
from mmserve.bench.lib.workloads import distinct_images, reuse_specs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu-dry-run")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (out / "run.log").read_text() == run.stdout
    return run.stdout, json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text()


def by_name(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in results["stages"]}


def test_every_stage_of_the_plan_ran_in_order_and_succeeded(dry_run) -> None:
    stdout, results, _ = dry_run
    assert [s["name"] for s in results["stages"]] == [s.name for s in stages(DRY_RUN)]
    assert {s["status"] for s in results["stages"]} == {"ok"}, results["stages"]
    assert results["mode"] == "dry-run" and results["device"] == "cpu"
    assert "gpu run (dry-run" in stdout and "parity tiny-qwen2-vl: float32 identical True" in stdout
    assert 0 < results["seconds"] < DRY_RUN.budget_s


def test_limits_and_parity_are_measured(dry_run) -> None:
    stages_ = by_name(dry_run[1])
    limits = stages_["limits"]["result"]
    assert limits["bandwidth_gb_s"] > 0.01 and limits["bf16_matmul_tflop_s"] > 0
    parity = stages_["parity:tiny-qwen2-vl"]["result"]
    assert parity["passed"] and parity["float32"]["identical"]
    for dtype in ("float32", "bfloat16"):  # the same engine decoded again without its graphs
        graphs = parity[dtype]["graphs"]
        assert graphs["mode"] == "static" and graphs["steps"] > 0
        assert graphs["identical_to_eager"] and graphs["close_to_eager"]
    assert parity["float32"]["equal_prefix"] == [DRY_RUN.parity_tokens] * parity["requests"]
    pytest_result = stages_["pytest"]["result"]
    assert pytest_result["passed"] > 0 and pytest_result["failures"] == 0


def test_both_engines_are_benchmarked_with_sane_numbers(dry_run) -> None:
    bench = by_name(dry_run[1])["bench:tiny-qwen2-vl"]["result"]
    assert 0 < bench["lm_params"] < bench["params"] < 5_000_000  # the tiny preset
    requests = DRY_RUN.reuse_requests
    for engine in ("mmserve", "transformers"):
        numbers = bench[engine]
        assert 0 < numbers["load_s"] < 120 and 0 < numbers["ttft_s"] < 60
        for batch in DRY_RUN.decode_batches:
            assert numbers[f"decode_b{batch}_tok_s"] > 0
    # mmserve decoded with its graphs (on CPU: the padded static path), then without them
    graphs = bench["mmserve"]["cuda_graphs"]
    assert graphs["mode"] == "static" and graphs["graphs"] == 0  # nothing captured on CPU
    assert graphs["decode_steps"] >= len(DRY_RUN.decode_batches) * (DRY_RUN.decode_tokens - 1)
    for batch in DRY_RUN.decode_batches:
        assert bench["mmserve"][f"decode_b{batch}_eager_tok_s"] > 0
        assert f"decode_b{batch}_eager_tok_s" not in bench["transformers"]
        assert len(numbers["multiturn_ttft_s"]) == DRY_RUN.turns
        assert numbers["reuse_0_req_s"] > 0 and numbers["reuse_30_req_s"] > 0
    # the encoder cache at work: one new image per turn, each distinct image once
    assert bench["mmserve"]["multiturn_images_encoded"] == [1] * DRY_RUN.turns
    assert bench["transformers"]["multiturn_images_encoded"] == list(range(1, DRY_RUN.turns + 1))
    # the chat about one image: mmserve encodes it once, transformers on every turn
    later = DRY_RUN.turns - 1
    assert bench["mmserve"]["followup_images_encoded"] == [1] + [0] * later
    assert bench["transformers"]["followup_images_encoded"] == [1] * DRY_RUN.turns
    distinct = distinct_images(reuse_specs(requests, 0.3, grouped=False, seed=0))
    assert distinct < requests
    assert bench["mmserve"]["reuse_30_images_encoded"] == distinct
    assert bench["transformers"]["reuse_30_images_encoded"] == requests


def test_the_profile_stage_profiles_decode_with_and_without_graphs_and_a_chat_turn(
    dry_run,
) -> None:
    profiled = by_name(dry_run[1])["profile:tiny-qwen2-vl"]["result"]
    assert profiled["decode_steps"] == DRY_RUN.profile_tokens
    for part in ("decode_b1_eager", "decode_b1_graphs", "chat_turn2"):
        p = profiled[part]
        assert 0 < p["wall_s"] < 60 and p["top_device"] == []  # no device activity on CPU
        assert len(p["top_cpu"]) >= 3
        assert all(o["calls"] > 0 and o["ms"] > 0 for o in p["top_cpu"])
    turns = profiled["chat_turns"]
    assert [t["turn"] for t in turns] == list(range(1, DRY_RUN.turns + 1))
    assert turns[1]["cached_tokens"] > 0  # turn 2 reused turn 1 from the prefix cache


def test_the_markdown_has_the_stage_parity_and_benchmark_tables(dry_run) -> None:
    markdown = dry_run[2]
    for stage in stages(DRY_RUN):
        assert f"| {stage.name} | ok |" in markdown
    assert "| tiny-qwen2-vl | True | True |" in markdown
    assert "### tiny-qwen2-vl (float32," in markdown
    for label in ("TTFT, one new image (s)", "decode tok/s, batch 4",
                  "decode tok/s, batch 4, eager (no decode graphs)",
                  "throughput req/s, 30 % image reuse",
                  "multi-turn TTFT, turn 2 (s)"):  # fmt: skip
        assert f"| {label} |" in markdown
    assert "Decode graphs: the padded static-shape path (no capture off CUDA) ran" in markdown
    assert "| static (" in markdown  # the parity table's graphs column
    assert "### Profile of tiny-qwen2-vl (`torch.profiler`; decode parts: 4 steps)" in markdown
    assert "| decode_b1_eager | " in markdown and "| chat_turn2 | " in markdown
