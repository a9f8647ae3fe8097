"""The GPU run's plan and supervision without a model: stage selection, the profile's round
trip to the engine process, time boxes and the budget (fail soft), pytest's counts and the
limits the tables put beside each number."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from mmserve.bench.gpu.plan import DRY_RUN, GPU, Profile, Stage, select, stages
from mmserve.bench.gpu.run import main
from mmserve.bench.gpu.supervise import pytest_counts, run_child_stages
from mmserve.bench.gpu.tables import limits_of, profile_lines, render


def test_the_gpu_plan_benchmarks_both_real_shapes_and_ends_with_pytest() -> None:
    names = [s.name for s in stages(GPU)]
    assert names == [
        "env", "build", "limits", "parity:shape:Qwen2-VL-2B-Instruct",
        "bench:shape:Qwen2-VL-2B-Instruct", "bench:shape:Qwen2.5-VL-3B-Instruct",
        "profile:shape:Qwen2-VL-2B-Instruct", "pytest",
    ]  # fmt: skip
    assert GPU.device == "cuda" and GPU.bench_dtype == "bfloat16" and 32 in GPU.decode_batches
    assert "--device" in GPU.pytest_args and GPU.pytest_args[-1] == "cuda"


def test_select_takes_kinds_or_names_and_names_the_valid_ones_on_a_typo() -> None:
    plan = stages(GPU)
    assert [s.name for s in select(plan, "limits,bench")] == [
        "limits", "bench:shape:Qwen2-VL-2B-Instruct", "bench:shape:Qwen2.5-VL-3B-Instruct",
    ]  # fmt: skip
    assert select(plan, None) == plan
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['bnech'\]; valid: .*'limits'"):
        select(plan, "bnech")


def test_a_profile_survives_its_json_round_trip() -> None:
    import json

    assert Profile.from_json(json.loads(json.dumps(DRY_RUN.as_json()))) == DRY_RUN


def test_bad_flags_are_one_line_errors() -> None:
    with pytest.raises(SystemExit, match="unknown stage"):
        main(["--dry-run", "--only", "nope", "--out", "/tmp/unused"])
    with pytest.raises(SystemExit, match="--budget-s must be positive"):
        main(["--dry-run", "--budget-s", "0"])


def test_a_stage_past_its_box_is_killed_and_the_next_runs_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    profile = dataclasses.replace(DRY_RUN, copy_bytes=1 << 20, matmul_size=32)
    plan = [Stage("env", 0.01), Stage("limits", 120)]  # env imports torch: past 0.01 s
    records: list[dict[str, Any]] = []
    with open(tmp_path / "gpu.log", "w") as log:
        run_child_stages(profile, plan, time.monotonic() + 300, log, records.append)
    assert [(r["name"], r["status"]) for r in records] == [("env", "timeout"), ("limits", "ok")]
    assert "time box" in records[0]["error"] and records[1]["result"]["bandwidth_gb_s"] > 0


def test_stages_past_the_budget_are_skipped_without_starting_anything(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    with open(tmp_path / "gpu.log", "w") as log:
        run_child_stages(DRY_RUN, stages(DRY_RUN)[:2], time.monotonic(), log, records.append)
    assert [(r["name"], r["status"]) for r in records] == [("env", "skipped"), ("build", "skipped")]


def test_pytest_counts_come_from_the_junit_xml(tmp_path: Path) -> None:
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.a" name="ok"/><testcase classname="tests.a" name="bad">'
        '<failure/></testcase><testcase classname="tests.a" name="s"><skipped/></testcase>'
        '<testcase classname="tests.b" name="ok"/></testsuite></testsuites>'
    )
    assert pytest_counts(xml) == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1,
                                  "passed": 2, "failed_tests": ["tests.a::bad"]}  # fmt: skip


BENCH = {
    "dtype": "bfloat16", "params": 2_200_000_000, "lm_params": 1_500_000_000,
    "mmserve": {"load_s": 4.0, "ttft_s": 0.05, "decode_b1_tok_s": 300.0,
                "decode_b32_tok_s": 6000.0, "prompt_tokens_one_image": 700,
                "multiturn_ttft_s": [0.05, 0.04], "followup_ttft_s": [0.05, 0.01],
                "reuse_30_req_s": 20.0},
    "transformers": {"load_s": 6.0, "ttft_s": 0.1, "decode_b1_tok_s": 30.0,
                     "multiturn_ttft_s": [0.1, 0.2], "followup_ttft_s": [0.1, 0.08],
                     "reuse_30_req_s": 2.0},
}  # fmt: skip
LIMITS = {"bandwidth_gb_s": 3000.0, "bf16_matmul_tflop_s": 800.0, "matmul_size": 8192}


def test_limits_are_bandwidth_bound_at_batch_one_and_compute_bound_for_prefill() -> None:
    bounds = limits_of(BENCH, LIMITS)
    assert bounds["decode_b1_tok_s"] == pytest.approx(3000e9 / (2 * 1.5e9))  # 1000 tok/s
    assert bounds["decode_b32_tok_s"] == pytest.approx(32000)  # 32 x 1000, under 800e12 / 3e9
    assert bounds["ttft_s"] == pytest.approx(2 * 1.5e9 * 700 / 800e12)
    assert limits_of(BENCH, None) == {}


def test_the_markdown_puts_each_number_beside_transformers_and_its_limit() -> None:
    ok = {"status": "ok", "seconds": 1.0}
    results = {
        "mode": "gpu", "device": "cuda", "started": "2026-11-27T12:00:00", "seconds": 300.0,
        "stages": [
            {**ok, "name": "env", "kind": "env", "model": None,
             "result": {"device_name": "NVIDIA H100", "versions": {"torch": "2.11.0"}}},
            {**ok, "name": "limits", "kind": "limits", "model": None, "result": LIMITS},
            {**ok, "name": "bench:m", "kind": "bench", "model": "m", "result": BENCH},
            {"name": "pytest", "kind": "pytest", "model": None, "status": "timeout",
             "seconds": 150.0, "error": "killed after 150 s; see pytest.log"},
        ],
    }  # fmt: skip
    text = render(results)
    assert text.startswith("# mmserve GPU run (gpu)\n\nNVIDIA H100, torch 2.11.0")
    assert "| pytest | timeout | 150.0 | killed after 150 s; see pytest.log |" in text
    assert "| decode tok/s, batch 1 | 300 | 30 | 10x | 1e+03 | 30 |" in text
    assert "| decode tok/s, batch 32 | 6e+03 | – | –x | 3.2e+04 | 18.8 |" in text
    assert "| multi-turn TTFT, turn 2 (s) | 0.04 | 0.2 | 5x | – | – |" in text
    assert "| chat about one image, TTFT, turn 2 (s) | 0.01 | 0.08 | 8x | – | – |" in text


def test_the_profile_table_shows_each_part_its_syncs_and_top_operators() -> None:
    def part(wall: float, syncs: dict[str, int], op: str) -> dict[str, Any]:
        top = [{"op": op, "calls": 28, "ms": 40.0}, {"op": "aten::mm", "calls": 196, "ms": 9.5}]
        return {"wall_s": wall, "wall_per_step_s": wall / 16, "syncs": syncs, "top_cpu": top,
                "top_device": top[::-1]}  # fmt: skip

    result = {
        "decode_steps": 16,
        "decode_b1_eager": part(1.6, {"aten::_local_scalar_dense": 64}, "aten::index_select"),
        "decode_b1_graphs": part(0.08, {}, "cudaGraphLaunch"),
        "chat_turn2": part(1.2, {"cudaMemcpyAsync": 3}, "aten::conv3d"),
        "chat_turns": [
            {
                "turn": 1,
                "ttft_s": 0.15,
                "encoder_s": 0.05,
                "prompt_tokens": 900,
                "cached_tokens": 0,
            },
            {
                "turn": 2,
                "ttft_s": 1.2,
                "encoder_s": 0.9,
                "prompt_tokens": 1800,
                "cached_tokens": 896,
            },
        ],  # fmt: skip
    }
    text = "\n".join(profile_lines("m", result))
    assert text.startswith("### Profile of m (`torch.profiler`; decode parts: 16 steps)")
    assert (
        "| decode_b1_eager | 1.6 | 0.1 | aten::_local_scalar_dense 64 | aten::index_select x28 40;"
        " aten::mm x196 9.5 | aten::mm x196 9.5; aten::index_select x28 40 |"
    ) in text
    assert "| decode_b1_graphs | 0.08 | 0.005 | – | cudaGraphLaunch x28 40;" in text
    assert "| chat_turn2 | 1.2 | 0.075 | cudaMemcpyAsync 3 | aten::conv3d x28 40;" in text
    assert text.endswith("turn: 1: 0.15 s (0/900 cached), 2: 1.2 s (896/1800 cached).")
