"""Block pool and KV cache manager: prefix hits, last token, LRU eviction, revival, ref counts."""

from __future__ import annotations

import pytest

from mmserve.core.block_pool import BlockPool
from mmserve.core.kv_cache_manager import KVCacheManager
from tests.support.scheduler import make_request

BS = 16


def admit(kv: KVCacheManager, req):
    kv.update_block_hashes(req)
    blocks, hit = kv.get_computed_blocks(req)
    req.num_computed_tokens = hit
    assert kv.allocate_slots(req, req.num_tokens - hit, blocks) is not None
    req.num_computed_tokens = req.num_tokens
    return hit


def test_pool_lru_free_queue_and_ref_counts():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert pool.num_free_blocks == 2 and a.ref_cnt == 1
    pool.free_blocks([b, a])  # b evicted before a
    taken = pool.get_new_blocks(3)
    assert [blk.block_id for blk in taken] == [2, 3, b.block_id]
    with pytest.raises(ValueError, match="only 1 free"):
        pool.get_new_blocks(2)


def test_hit_miss_and_partial_hit():
    kv = KVCacheManager(100, BS)
    first = make_request("1", [20, ("a", 20), 24])  # 64 tokens = 4 blocks
    assert admit(kv, first) == 0
    same = make_request("2", [20, ("a", 20), 24])
    assert admit(kv, same) == 48  # never the last token's block
    other_image = make_request("3", [20, ("b", 20), 24])
    assert admit(kv, other_image) == 16  # only the text block before the image
    assert kv.prefix_cache_hits == 0  # counting is the scheduler's call


def test_last_token_never_cached():
    kv = KVCacheManager(100, BS)
    admit(kv, make_request("1", [32]))
    exact = make_request("2", [32])
    kv.update_block_hashes(exact)
    _, hit = kv.get_computed_blocks(exact)
    assert hit == 16  # 32 tokens: block 1 holds the last token, so it is recomputed


def test_freed_blocks_keep_hash_revive_and_lru_eviction_order():
    kv = KVCacheManager(7, BS)
    r1 = make_request("1", [48])
    admit(kv, r1)
    kv.free(r1)
    assert kv.num_free_blocks == 7 and len(kv.pool.cached) == 3
    r2 = make_request("2", [48])
    assert admit(kv, r2) == 32  # revived from the free queue
    assert [b.ref_cnt for b in kv.req_blocks["2"]] == [1, 1, 1]
    kv.free(r2)
    # Tail blocks are freed first, so they are evicted first; the shared prefix survives longest.
    other = make_request("3", [64])
    other.all_token_ids = [1] * 64  # tokens no other request shares
    other.prompt_token_ids = list(other.all_token_ids)
    kv.update_block_hashes(other)
    # takes 4 of the 7 free blocks: the 3 never used, then the chain's tail (block 2)
    assert kv.allocate_slots(other, 64) is not None
    assert len(kv.pool.cached) == 2 + 4  # 3 old minus 1 evicted, plus 4 new
    r4 = make_request("4", [48])
    assert admit(kv, r4) == 32  # blocks 0 and 1 of the old chain survived


def test_allocation_failure_changes_nothing_and_all_free_at_end():
    kv = KVCacheManager(4, BS)
    r1 = make_request("1", [40])
    admit(kv, r1)
    r2 = make_request("2", [40])
    kv.update_block_hashes(r2)
    blocks, hit = kv.get_computed_blocks(r2)
    r2.num_computed_tokens = hit
    free_before = kv.num_free_blocks
    assert kv.allocate_slots(r2, 100) is None
    assert kv.num_free_blocks == free_before and "2" not in kv.req_blocks
    kv.free(r1)
    assert kv.num_free_blocks == 4
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)


def test_prefix_caching_off():
    kv = KVCacheManager(100, BS, enable_prefix_caching=False)
    admit(kv, make_request("1", [48]))
    r2 = make_request("2", [48])
    assert admit(kv, r2) == 0 and not r2.block_hashes and not kv.pool.cached


def test_blocks_of_a_failed_step_are_unregistered():
    kv = KVCacheManager(100, BS)
    done = make_request("1", [32])
    kv.begin_step()
    admit(kv, done)
    kv.begin_step()  # step 1 ran
    failed = make_request("2", [40, 24])
    kv.update_block_hashes(failed)
    blocks, hit = kv.get_computed_blocks(failed)
    failed.num_computed_tokens = hit
    assert kv.allocate_slots(failed, 64 - hit, blocks) is not None
    probe = make_request("3", [40, 24])
    kv.update_block_hashes(probe)
    assert kv.get_computed_blocks(probe)[1] == 48  # visible within the step
    kv.rollback_step()
    assert kv.get_computed_blocks(probe)[1] == 32  # only the blocks of step 1 survive
