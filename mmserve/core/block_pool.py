"""KV block pool: reference counts, an O(1) LRU free queue and the hash -> block map."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hashed={self.block_hash is not None})"


class BlockPool:
    """Owns every KV block.

    Invariants:
    - a block is in the free queue iff its ref_cnt is 0; the queue is ordered by release time
      (least recently freed first), so eviction pops from the front in O(1);
    - a block with a hash is in ``cached`` under that hash (and only one block per hash);
      a free block keeps its hash until it is handed out again, so it stays matchable;
    - num_free_blocks + blocks with ref_cnt > 0 == num_blocks.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the front of the free queue, evicting their cached hashes."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} KV blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a reference to each block (a prefix-cache hit), reviving free ones."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; pass them in the order they should be evicted."""
        for block in blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    def cache_block(self, block: KVBlock, block_hash: bytes) -> bool:
        """Record that ``block`` holds the KV of a full block with ``block_hash``; False if the
        block already has a hash or another block holds this one."""
        if block.block_hash is not None or block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def uncache_block(self, block: KVBlock) -> None:
        """Forget ``block``'s hash (its KV turned out not to be written)."""
        if block.block_hash is not None and self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)
