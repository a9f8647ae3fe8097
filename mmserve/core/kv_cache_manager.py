"""Per-request block tables on top of the shared BlockPool."""

from __future__ import annotations

from mmserve.core.block_pool import BlockPool, KVBlock
from mmserve.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Maps each request to the KV blocks that hold its tokens.

    Invariants:
    - ``req_blocks[r]`` has exactly cdiv(slots reserved for r, block_size) blocks, each with a
      reference held by r; slots are reserved for computed tokens plus tokens scheduled this step;
    - ``free(r)`` returns every reference r holds, tail first (so a request's last blocks are
      evicted before its shared prefix);
    - after all requests are freed, every block is back in the pool's free queue.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.req_blocks: dict[str, list[KVBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def block_ids(self, req_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(req_id, [])]

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[KVBlock] = ()
    ) -> list[int] | None:
        """Reserve slots for ``num_new_tokens`` after ``request.num_computed_tokens`` (which
        already counts ``computed_blocks``, the prefix hit being attached). Returns the ids of the
        blocks added to the request's table, or None (nothing changed) if the pool is short."""
        blocks = self.req_blocks.setdefault(request.req_id, [])
        total = request.num_computed_tokens + num_new_tokens
        num_needed = cdiv(total, self.block_size) - len(blocks) - len(computed_blocks)
        num_revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if max(num_needed, 0) + num_revived > self.pool.num_free_blocks:
            if not blocks:
                del self.req_blocks[request.req_id]
            return None
        self.pool.touch(computed_blocks)
        added = list(computed_blocks)
        if num_needed > 0:
            added += self.pool.get_new_blocks(num_needed)
        blocks.extend(added)
        return [b.block_id for b in added]

    def free(self, request: Request) -> None:
        blocks = self.req_blocks.pop(request.req_id, [])
        self.pool.free_blocks(reversed(blocks))
