"""``engine/malloc_tuning.py``: opt-in by environment, applied once per process."""

from __future__ import annotations

import ctypes

from mmserve.engine.setup import malloc_tuning


def test_tune_malloc_once_and_opt_out(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibc())
    monkeypatch.setattr(malloc_tuning, "_applied", None)
    monkeypatch.delenv(malloc_tuning.ENV, raising=False)
    assert malloc_tuning.tune_malloc() is False and calls == []  # off by default

    monkeypatch.setattr(malloc_tuning, "_applied", None)
    monkeypatch.setenv(malloc_tuning.ENV, "1")
    assert malloc_tuning.tune_malloc() is True
    assert dict(calls) == {
        malloc_tuning.M_MMAP_THRESHOLD: 32 << 20,
        malloc_tuning.M_TRIM_THRESHOLD: malloc_tuning.TRIM_THRESHOLD,
        malloc_tuning.M_TOP_PAD: malloc_tuning.TOP_PAD,
    }
    assert malloc_tuning.tune_malloc() is True and len(calls) == 3  # once per process

    monkeypatch.setattr(malloc_tuning, "_applied", None)
    monkeypatch.setenv(malloc_tuning.ENV, "0")
    assert malloc_tuning.tune_malloc() is False and len(calls) == 3


def test_tune_malloc_without_glibc(monkeypatch):
    def no_libc(name):
        raise OSError("not found")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    monkeypatch.setattr(malloc_tuning, "_applied", None)
    monkeypatch.setenv(malloc_tuning.ENV, "1")
    assert malloc_tuning.tune_malloc() is False
