"""EncoderCacheManager: shared, refcounted, LRU over unreferenced entries, lazy eviction."""

from __future__ import annotations

import pytest

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.inputs import MultiModalItem


def test_allocate_and_reuse_across_requests():
    cache = EncoderCacheManager(100, bytes_per_embedding=8)
    cache.allocate("a", "r1", 40)
    assert cache.contains("a") and cache.num_free == 60 and cache.num_bytes == 320
    assert cache.add_ref("a", "r2") is True
    assert cache.add_ref("a", "r2") is False  # already referenced by r2
    assert cache.referenced["a"] == {"r1", "r2"}


def test_free_to_lru_revive_and_capacity_accounting():
    cache = EncoderCacheManager(100)
    cache.allocate("a", "r1", 40)
    cache.release("a", "r1")
    assert "a" in cache.unreferenced and cache.contains("a")
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
    assert not cache.contains("b") and cache.contains("a") and cache.contains("c")
    assert cache.take_freed() == ["b"]
    assert cache.take_freed() == []  # drained once
    assert cache.num_evictions == 1
    assert not cache.can_allocate(41)  # c and d are referenced, a is the only evictable
    with pytest.raises(ValueError, match="cannot fit"):
        cache.allocate("e", "r5", 41)


def test_colliding_hashes_of_other_lengths_are_separate_entries():
    a40 = MultiModalItem("a", 0, 40)
    a41 = MultiModalItem("a", 50, 41)
    cache = EncoderCacheManager(100)
    cache.allocate(a40.key, "r1", 40)
    assert not cache.contains(a41.key)  # a miss, not an exception
    cache.allocate(a41.key, "r2", 41)
    assert cache.num_free == 19


def test_discard_forgets_an_entry_and_reports_it():
    cache = EncoderCacheManager(100)
    cache.allocate("a", "r1", 40)
    cache.discard("a")
    assert not cache.contains("a") and cache.num_free == 100 and not cache.referenced
    assert cache.take_freed() == ["a"]


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
    assert cache.contains("a")  # r2 still needs it
    cache.release("a", "r2")
    assert not cache.contains("a") and cache.num_free == 100
    assert cache.take_freed() == ["a"]
