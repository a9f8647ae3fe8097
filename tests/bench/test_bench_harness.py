"""The benchmark harness: priority raising (on fake /proc files), interleaved rounds, spread,
the run meter and the README tables of ``bench all`` (milliseconds, no engines)."""

from __future__ import annotations

import json
import os

import pytest

from mmserve.bench.all import run as bench_all
from mmserve.bench.lib import harness, priority, provenance
from mmserve.bench.lib.engines.meter import Meter, group_cpu_s


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """Autogroup files in tmp_path, a fresh attempt record and no real setpriority."""
    enabled, group = tmp_path / "sched_autogroup_enabled", tmp_path / "autogroup"
    enabled.write_text("1\n")
    group.write_text("/autogroup-9 nice 0\n")
    monkeypatch.setattr(priority, "AUTOGROUP_ENABLED", enabled)
    monkeypatch.setattr(priority, "AUTOGROUP", group)
    monkeypatch.setattr(priority, "_PRIORITY", {"requested": False})
    calls = []
    monkeypatch.setattr(os, "setpriority", lambda *a: calls.append(a))
    restored = []
    monkeypatch.setattr(priority.atexit, "register", lambda f, *a: restored.append((f, a)))
    return enabled, group, calls, restored


def test_raise_priority_writes_the_autogroup_and_restores_it_at_exit(fake_proc):
    _, group, calls, restored = fake_proc
    state = priority.raise_priority()
    assert state["raised"] and state["autogroup_nice"] == -20
    assert state["effective"] == "autogroup nice -20" and "reason" not in state
    assert group.read_text().strip() == "-20"
    assert calls == [(os.PRIO_PROCESS, 0, -20)]
    ((func, fargs),) = restored
    func(*fargs)
    assert group.read_text().strip() == "0"
    assert priority.raise_priority()["raised"]  # idempotent: no second attempt
    assert len(calls) == 1


def test_raise_priority_says_why_it_could_not(fake_proc, monkeypatch):
    enabled, group, _, _ = fake_proc
    group.unlink()
    group.mkdir()  # writing it fails like a permission error would

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    state = priority.raise_priority()
    assert not state["raised"]
    assert state["reason"].startswith("could not raise: autogroup:")
    assert "process nice: Operation not permitted" in state["reason"]


def test_without_autogroups_the_process_nice_counts(fake_proc):
    enabled, _, calls, _ = fake_proc
    enabled.write_text("0\n")
    state = priority.raise_priority()
    assert state["raised"] and calls and state["effective"].startswith("process nice")
    assert "sched_autogroup_enabled=0" in state["notes"][0]


def test_no_raise_priority_flag_leaves_it(fake_proc, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    priority.add_priority_arg(parser)
    args = parser.parse_args(["--no-raise-priority"])
    state = priority.apply_priority(args)
    assert not state["requested"] and fake_proc[1].read_text().startswith("/autogroup-9")
    assert "scheduling priority: autogroup nice 0" in capsys.readouterr().out


def test_interleaved_rounds_run_every_engine_once_per_round_rotated():
    seen = []
    results, order = harness.interleaved(
        ["a", "b", "c"], 3, lambda engine, rnd: seen.append((rnd, engine)) or f"{engine}{rnd}"
    )
    assert seen == order
    assert [e for r, e in order if r == 0] == ["a", "b", "c"]
    assert [e for r, e in order if r == 1] == ["b", "c", "a"]
    assert [e for r, e in order if r == 2] == ["c", "a", "b"]
    assert results == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1", "c2"]}


def test_spread_and_its_formatting():
    s = harness.spread([3.0, 1.0, 2.0, 10.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.0, 1.0, 10.0, 5)
    assert s["q1"] == 2.0 and s["q3"] == 4.0
    assert harness.spread([2.0, 1.0])["q1"] == 1.0  # fewer than 4 values: min / max
    row: dict = {}
    harness.with_spread(row, "x", [1.0, 2.0, 4.0])
    assert row == {"x": 2.0, "x_min": 1.0, "x_max": 4.0, "x_q1": 1.0, "x_q3": 4.0}
    assert harness.fmt_spread(row, "x") == "2 (1-4)"
    assert harness.fmt_spread({"x": 2.0}, "x") == "2"


def test_meter_counts_this_process_and_not_as_others():
    meter = Meter(os.getpgrp())
    sum(i * i for i in range(200_000))
    m = meter.stop()
    assert m["wall_s"] > 0 and m["cpu_s"] >= 0
    if m["others_cores"] is not None:  # Linux
        assert m["others_cores"] >= 0 and m["runq_wait_s"] >= 0
        assert m["server_cpu_s"] >= 0 and group_cpu_s(os.getpgrp()) > 0


def test_versions_and_threads_are_recorded():
    versions = provenance.engine_versions()
    assert versions["torch"] and "mmserve_commit" in versions
    assert provenance.threads_info(2)["threads"] == 2


def _reuse_json(path, engines, rps, zipf=False):
    rows = []
    for engine, value in zip(engines, rps, strict=True):
        row = {"engine": engine, "prefix_hit_rate": 0.25, "encoder_hit_rate": 0.5}
        harness.with_spread(row, "req_per_s", [value * 0.9, value, value * 1.1])
        if zipf:
            row["wall_over_limit"] = 1.01
        rows.append(row)
    args = {"requests": 200, "resolution": "720p"}
    path.write_text(json.dumps({"args": args, "rows": rows, "encode_once": {"limit_s": 5.0}}))


def test_render_tables_from_result_files(tmp_path):
    engines = ["mmserve", "mmserve-nocache", "vllm"]
    _reuse_json(tmp_path / "reuse_m_0pct_grouped_all.json", engines, [20.0, 21.0, 16.0])
    _reuse_json(tmp_path / "reuse_m_zipf_D32_all.json", engines, [30.0, 20.0, 20.0], zipf=True)
    turns = []
    for engine, base in (("mmserve", 0.1), ("mmserve-nocache", 0.2), ("vllm", 0.15)):
        for turn in (1, 2):
            row = {"engine": engine, "turn": turn, "images_encoded": 1, "cached_tokens": 5}
            harness.with_spread(row, "ttft_s", [base * turn, base * turn * 1.2])
            turns.append(row)
    multiturn = {"args": {"turns": 2, "resolution": "720p"}, "rows": turns}
    (tmp_path / "multiturn_m_720p.json").write_text(json.dumps(multiturn))
    (tmp_path / "all.json").write_text(json.dumps({"args": {"model": "m", "qwen_model": "q"}}))
    text = bench_all.render_tables(tmp_path)
    assert "| 0 % reuse | 20 (18-22) [1.00] | – | 21 (18.9-23.1) [1.05] | – | 16" in text
    assert "wall time / encode-once limit (5.00 s) = mmserve 1.01" in text
    assert "| 2 | 0.22 (0.2-0.24) | 0.44 (0.4-0.48) | 0.33 (0.3-0.36) | 1 / 1 | 5 |" in text
    assert "| reuse 0 %: mmserve / vLLM req/s | 1.25 | >= 1.1 | met |" in text
    assert "| Zipf D=32: mmserve / vLLM req/s | 1.50 | >= 1.35 | met |" in text
    assert "not measured" in text  # no Qwen2-VL or serve results here


def test_bench_all_commands_cover_the_readme_sections(tmp_path):
    args = bench_all.build_parser().parse_args(
        ["--out", str(tmp_path), "--vllm-python", "/v/python", "--no-raise-priority"]
    )
    commands = {s.name: bench_all.section_command(s, args) for s in bench_all.SECTIONS}
    assert set(commands) >= {"multiturn-llava", "multiturn-qwen2-vl", "reuse-0", "zipf-all"}
    reuse0 = commands["reuse-0"]
    assert reuse0[1:4] == ["-m", "mmserve.bench.cli", "reuse"]
    assert "--vllm-python" in reuse0 and "--no-raise-priority" in reuse0
    assert reuse0[reuse0.index("--reuse") + 1] == "0"
    assert "--launch" in commands["serve"] and "mmserve,vllm" in commands["serve"]
    assert "--vllm-python" not in commands["probe-llava"]
    assert commands["adversarial"][1].endswith("benchmarks/adversarial_load.py")


def test_envs_variants_presets_and_parsing(tmp_path, monkeypatch):
    from mmserve.bench import envs

    table = envs.presets(2)
    assert table["gomp-affinity"] == {"GOMP_CPU_AFFINITY": "0-1"}
    assert table["glibc"]["MMSERVE_MALLOC_TUNING"] == "0"
    name, env, extra = envs.parse_variant("one:OMP_NUM_THREADS=1 X=a=b --threads 1")
    assert (name, env, extra) == ("one", {"OMP_NUM_THREADS": "1", "X": "a=b"}, ["--threads", "1"])
    with pytest.raises(SystemExit):
        envs.parse_variant("bad:NOEQUALS")
    lib = tmp_path / envs.JEMALLOC
    lib.write_text("")
    monkeypatch.setattr(envs, "LIB_DIRS", (str(tmp_path),))
    assert envs.resolve(table["jemalloc"])[0]["LD_PRELOAD"] == str(lib)
    _, why = envs.resolve(table["tcmalloc"])
    assert why and envs.TCMALLOC in why


def test_interleaved_offset_continues_the_rotation():
    _, order = harness.interleaved(["a", "b", "c"], 1, lambda e, r: None, offset=2)
    assert [e for _, e in order] == ["c", "a", "b"]


def test_contended_runs_are_retried_and_left_out_of_medians():
    meters = iter([{"others_cores": 1.0}, {"others_cores": 0.9}, {"others_cores": 0.1}])
    results, order = harness.interleaved(
        ["a"], 1, lambda e, r: next(meters), contended=harness.is_contended, retries=5
    )
    assert results == {"a": [{"others_cores": 0.1}]} and len(order) == 3
    dirty = {"others_cores": 2.0}
    assert harness.is_contended([None, dirty]) and not harness.is_contended({"x": 1})
    assert harness.uncontended([1, 2], [dirty, None], 0.5) == [2]
    assert harness.uncontended([1, 2], [dirty, dirty], 0.5) == [1, 2]  # none clean: all
