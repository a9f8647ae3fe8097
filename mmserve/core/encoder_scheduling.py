"""The per-request image walk that fits encoder work into a chunked-prefill step."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.request import Request


@dataclass
class EncoderPlan:
    """What one request's chunk needs from the encoder: nothing is reserved until committed."""

    num_new_tokens: int
    to_encode: list[int] = field(default_factory=list)  # item indices (cache misses)
    to_reference: list[int] = field(default_factory=list)  # item indices found in the cache
    num_embeddings_to_encode: int = 0


def plan_encoder_inputs(
    request: Request,
    num_new_tokens: int,
    cache: EncoderCacheManager,
    budget_left: int,
    disable_chunked_mm_input: bool,
) -> EncoderPlan:
    """Walk the request's images that overlap [C, C + num_new_tokens) and shrink the chunk when
    an image cannot be served. The result never has a negative token count; it is 0 when the
    computed position already sits inside an image that can be neither found nor encoded."""
    start = request.num_computed_tokens
    plan = EncoderPlan(num_new_tokens)
    new_hashes: set[str] = set()
    pinned: dict[str, int] = {}  # unreferenced entries this plan references: not evictable
    for idx, item in enumerate(request.mm_items):
        end = start + plan.num_new_tokens
        if item.offset >= end:
            break
        if item.end <= start:
            continue  # already in the KV cache
        if disable_chunked_mm_input and start <= item.offset and end < item.end:
            plan.num_new_tokens = item.offset - start
            break
        if item.hash in new_hashes or cache.contains(item.hash, item.length):
            if item.hash in cache.unreferenced and item.hash not in pinned:
                # pinning it must not take the space the encodes planned so far rely on
                if not cache.can_allocate(
                    plan.num_embeddings_to_encode + sum(pinned.values()) + item.length
                ):
                    plan.num_new_tokens = max(item.offset - start, 0)
                    break
                pinned[item.hash] = item.length
            plan.to_reference.append(idx)
            continue
        needed = plan.num_embeddings_to_encode + item.length
        if needed > budget_left or not cache.can_allocate(needed + sum(pinned.values())):
            plan.num_new_tokens = max(item.offset - start, 0)
            break
        plan.to_encode.append(idx)
        plan.num_embeddings_to_encode = needed
        new_hashes.add(item.hash)
    return plan


def commit_encoder_plan(
    request: Request, plan: EncoderPlan, cache: EncoderCacheManager
) -> tuple[int, int]:
    """Take the references the plan needs. Returns (new cache hits, embeddings they saved)."""
    hits = saved = 0
    new_hashes = {request.mm_items[idx].hash for idx in plan.to_encode}
    for idx in plan.to_reference:  # pin cached entries before allocating can evict them
        item = request.mm_items[idx]
        if item.hash not in new_hashes and cache.add_ref(item.hash, request.req_id):
            hits += 1
            saved += item.length
    for idx in plan.to_encode:
        item = request.mm_items[idx]
        cache.allocate(item.hash, request.req_id, item.length)
    return hits, saved


def release_encoded_inputs(request: Request, cache: EncoderCacheManager) -> None:
    """Release the references of images whose tokens are all in the KV cache now."""
    computed = request.num_computed_tokens
    pending = {item.hash for item in request.mm_items if item.end > computed}
    for item in request.mm_items:
        if item.end > computed:
            break
        if item.hash not in pending:  # the same image later in the prompt still needs it
            cache.release(item.hash, request.req_id)
