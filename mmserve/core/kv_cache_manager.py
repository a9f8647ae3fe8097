"""Per-request block tables on top of the shared BlockPool, with multimodal prefix caching."""

from __future__ import annotations

from collections.abc import Sequence

from mmserve.core.block_hash import BlockHasher
from mmserve.core.block_pool import BlockPool, KVBlock
from mmserve.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Maps each request to the KV blocks that hold its tokens; shares full blocks by hash.

    Invariants:
    - ``req_blocks[r]`` has exactly cdiv(slots reserved for r, block_size) blocks, each with a
      reference held by r; slots are reserved for computed tokens plus tokens scheduled this step;
    - the first ``num_hashed[r]`` blocks of r are registered in the pool under r's block hashes
      as soon as they are full of computed or scheduled tokens (a request later in the same step
      may hit them: each layer writes K/V before attending); if the step fails,
      ``rollback_step`` unregisters them, so a hash always names KV that was written;
    - a prefix hit never covers a request's last token (its logits are needed), nor any token
      of a request asking for prompt logprobs;
    - ``free(r)`` returns every reference r holds, tail first (so a request's last blocks are
      evicted before its shared prefix); freed blocks keep their hash until reused;
    - after all requests are freed, every block is back in the pool's free queue.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_algo: str = "xxh3_128",
        hash_seed: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.hasher = BlockHasher(hash_algo, hash_seed) if enable_prefix_caching else None
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_hashed: dict[str, int] = {}
        self._registered_this_step: list[tuple[str, int, KVBlock]] = []
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def block_ids(self, req_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(req_id, [])]

    def update_block_hashes(self, request: Request) -> None:
        """Hash the request's newly full blocks (once each); no-op without prefix caching."""
        if self.hasher is not None:
            self.hasher.extend(request, self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of ``request`` as (blocks, tokens); takes no references."""
        if self.hasher is None or request.skips_prefix_cache:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_query(self, num_queried: int, num_hit: int) -> None:
        self.prefix_cache_queries += num_queried
        self.prefix_cache_hits += num_hit

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[KVBlock] = ()
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
        if self.hasher is not None:  # shareable at once: a later request of this step may hit it
            self._cache_full_blocks(request, blocks, total // self.block_size)
        return [b.block_id for b in added]

    def _cache_full_blocks(self, request: Request, blocks: list[KVBlock], num_full: int) -> None:
        done = self.num_hashed.get(request.req_id, 0)
        num_full = min(num_full, len(request.block_hashes))
        for i in range(done, num_full):
            if self.pool.cache_block(blocks[i], request.block_hashes[i]):
                self._registered_this_step.append((request.req_id, i, blocks[i]))
        self.num_hashed[request.req_id] = max(done, num_full)

    def begin_step(self) -> None:
        """The previous step ran: its registrations are final."""
        self._registered_this_step.clear()

    def rollback_step(self) -> None:
        """The step failed: unregister the blocks it registered (their KV was never written)."""
        for req_id, index, block in reversed(self._registered_this_step):
            self.pool.uncache_block(block)
            if req_id in self.num_hashed:
                self.num_hashed[req_id] = min(self.num_hashed[req_id], index)
        self._registered_this_step.clear()

    def num_blocks_of(self, req_id: str) -> int:
        return len(self.req_blocks.get(req_id, ()))

    def truncate(self, request: Request, num_blocks: int) -> None:
        """Give back the blocks past the first ``num_blocks`` of ``request`` (a rolled-back
        step; call ``rollback_step`` first so none of them stays registered)."""
        blocks = self.req_blocks.get(request.req_id)
        if blocks is None:
            return
        extra = blocks[num_blocks:]
        del blocks[num_blocks:]
        self.pool.free_blocks(reversed(extra))
        if not blocks:
            del self.req_blocks[request.req_id]
            self.num_hashed.pop(request.req_id, None)
        elif request.req_id in self.num_hashed:
            self.num_hashed[request.req_id] = min(self.num_hashed[request.req_id], num_blocks)

    def free(self, request: Request) -> None:
        blocks = self.req_blocks.pop(request.req_id, [])
        self.num_hashed.pop(request.req_id, None)
        self.pool.free_blocks(reversed(blocks))
