"""EncoderCacheManager: shared, refcounted, LRU over unreferenced entries, lazy eviction."""

from __future__ import annotations

import pytest

from mmserve.core.encoder_cache import EncoderCacheManager


def test_allocate_and_reuse_across_requests():
    cache = EncoderCacheManager(100, bytes_per_embedding=8)
    cache.allocate("a", "r1", 40)
    assert cache.contains("a", 40) and cache.num_free == 60 and cache.num_bytes == 320
    assert cache.add_ref("a", "r2") is True
    assert cache.add_ref("a", "r2") is False  # already referenced by r2
    assert cache.referenced["a"] == {"r1", "r2"}


def test_free_to_lru_revive_and_capacity_accounting():
    cache = EncoderCacheManager(100)
    cache.allocate("a", "r1", 40)
    cache.release("a", "r1")
    assert "a" in cache.unreferenced and cache.contains("a", 40)
    assert cache.num_free == 60  # still cached: eviction is lazy
    assert cache.can_allocate(100)  # ...but its space is reclaimable
    cache.add_ref("a", "r2")  # revive
    assert "a" not in cache.unreferenced and not cache.can_allocate(61)


def test_evicts_oldest_unreferenced_only():
    cache = EncoderCacheManager(100)
    for h, req in (("a", "r1"), ("b", "r2"), ("c", "r3")):
        cache.allocate(h, req, 30)
    cache.release("b", "r2")
    cache.release("a", "r1")  # released after b: b is the oldest unreferenced
    cache.allocate("d", "r4", 40)
    assert not cache.contains("b", 30) and cache.contains("a", 30) and cache.contains("c", 30)
    assert cache.take_freed() == ["b"]
    assert cache.take_freed() == []  # drained once
    assert cache.num_evictions == 1
    assert not cache.can_allocate(41)  # c and d are referenced, a is the only evictable
    with pytest.raises(ValueError, match="cannot fit"):
        cache.allocate("e", "r5", 41)


def test_collision_with_other_length_raises():
    cache = EncoderCacheManager(100)
    cache.allocate("a", "r1", 40)
    with pytest.raises(RuntimeError, match="hash collision"):
        cache.contains("a", 41)


def test_release_unknown_is_noop_and_all_free_at_end():
    cache = EncoderCacheManager(50)
    cache.release("zzz", "r1")
    cache.allocate("a", "r1", 10)
    cache.add_ref("a", "r2")
    cache.release_all("r1", ["a", "a"])
    cache.release_all("r2", ["a"])
    assert not cache.referenced and list(cache.unreferenced) == ["a"]


def test_negative_capacity():
    with pytest.raises(ValueError, match="-1"):
        EncoderCacheManager(-1)


def test_cross_request_caching_off_evicts_on_last_release():
    cache = EncoderCacheManager(100, retain_unreferenced=False)
    cache.allocate("a", "r1", 40)
    cache.add_ref("a", "r2")
    cache.release("a", "r1")
    assert cache.contains("a", 40)  # r2 still needs it
    cache.release("a", "r2")
    assert not cache.contains("a", 40) and cache.num_free == 100
    assert cache.take_freed() == ["a"]
