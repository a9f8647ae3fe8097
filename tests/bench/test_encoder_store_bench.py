"""Smoke test of ``mmserve bench store`` (tiny sizes): every run answers the same, and the
restarted and second-replica engines encode nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from mmserve.bench.store import run as bench_store

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="no redis-server binary (apt-get install redis-server; .ci/run installs it)",
)


def test_bench_store_restart_and_replica_encode_nothing(tmp_path):
    argv = ["--model", "tiny-llava", "--images", "2", "--resolution", "480p", "--rounds", "3",
            "--out", str(tmp_path), "--no-raise-priority"]  # fmt: skip
    assert not bench_store.main(argv)["failed"]
    result = json.loads((tmp_path / "store.json").read_text())
    encodes = {run["run"]: run["encodes"] for run in result["restart"]}
    assert encodes == {
        "first start, store on (encodes, writes)": 2,
        "restart without the store": 2,
        "restart with the store (L2 disk)": 0,
        "second replica sharing Redis (L3 only)": 0,
    }
    assert {row["tier"] for row in result["tiers"]} == {"L1 ram", "L2 disk", "L3 redis"}
