"""Smoke test of ``mmserve bench video`` on the CI Qwen preset with tiny videos."""

from __future__ import annotations

from mmserve.bench import video


def test_bench_video_turn_two_encodes_nothing_and_memory_is_flat(tmp_path):
    argv = ["--model", "tiny-qwen2-vl", "--rounds", "1", "--frames", "4,16", "--chat-frames"]
    argv += ["8", "--size", "224x224", "--max-pixels", str(224 * 224), "--answer-tokens", "4"]
    result = video.main([*argv, "--out", str(tmp_path), "--no-raise-priority"])
    turn1, turn2 = result["chat"]
    assert (turn1["groups_encoded"], turn2["groups_encoded"]) == (4, 0)
    short, long = result["memory"]
    assert (short["groups_encoded"], long["groups_encoded"]) == (2, 8)
    # 64-embedding groups under a 113-embedding budget: one group per encoder call
    assert long["working_set_mib"] <= 1.2 * short["working_set_mib"]
    assert (tmp_path / "video.json").is_file()
