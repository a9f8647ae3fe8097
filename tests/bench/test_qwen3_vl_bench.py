"""The multi-turn and reuse benchmarks on Qwen3-VL (its CI preset, tiny sizes): every engine,
transformers included, gives the same tokens, and the caches do their work."""

from __future__ import annotations

import json

from mmserve.bench.lib.workloads import reuse_specs
from mmserve.bench.multiturn import run as multiturn
from mmserve.bench.reuse import run as reuse

MODEL = ["--model", "tiny-qwen3-vl", "--resolution", "480p", "--threads", "2"]
MODEL += ["--no-raise-priority", "--repeats", "1", "--retries", "0"]  # no rerun when contended


def test_multiturn(tmp_path):
    multiturn.main(
        [*MODEL, "--turns", "2", "--answer-tokens", "3", "--out", str(tmp_path)]
        + ["--engines", "mmserve,mmserve-nocache,transformers"]
    )
    saved = json.loads((tmp_path / "multiturn_tiny-qwen3-vl_480p.json").read_text())
    summary = {s["engine"]: s for s in saved["summary"]}
    assert summary["mmserve"]["images_encoded"] == 2  # each distinct image encoded once
    assert summary["mmserve-nocache"]["images_encoded"] == 3  # 1 + 2
    assert all(s["same_tokens_as_first"] for s in saved["summary"])


def test_reuse(tmp_path):
    out = reuse.main(
        [*MODEL, "--requests", "6", "--reuse", "0.5", "--max-tokens", "3"]
        + ["--arrival", "sequential", "--out", str(tmp_path)]
        + ["--engines", "mmserve,mmserve-nocache,transformers"]
    )
    on = out["rows"][0]
    assert on["images_encoded"] == len({s.image for s in reuse_specs(6, 0.5, grouped=True)})
    assert on["prefix_hit_rate"] > 0
    assert out["identical"]
