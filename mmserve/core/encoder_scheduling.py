"""The per-request image walk that fits encoder work into a chunked-prefill step.

References are per *occurrence*: a request holds an item's cache entry from the step that
schedules the item's first token until the item's last token is in the KV cache. A later
occurrence of the same image re-acquires the entry (a hit while it is cached, a re-encode
within budget once evicted), so a prompt like [A, B, A] never waits on its own reference.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mmserve.core.encoder_cache import EncoderCacheManager
from mmserve.request import EmbeddingSource, Request


@dataclass
class EncoderPlan:
    """What one request's chunk needs from the encoder: nothing is reserved until committed.

    An item missing from the cache whose embedding the encoder store returned at admission
    (``MultiModalItem.stored``) is a *load*: it takes cache space like an encode but none of
    the per-step encoder compute budget. ``stored`` is dropped once a step that ran reached the
    item (``drop_reached_stored``), so an entry evicted and needed again by the same request
    (preemption, a later occurrence of the image) is an encode, which the engine's admission
    checks guarantee fits the per-step budget; an item named by a media handle keeps it, so
    it is loaded again instead.

    ``blocked_on_space`` says the chunk was cut because the cache had no room (not because of
    the per-step compute budget): the scheduler then lets no later request of the step take
    cache space, so the space freed by finishing occurrences goes to the earlier request.

    An item missing from the cache that another replica is encoding (``MultiModalItem.awaited``
    still pending, see ``settle_store_waits``) is neither encoded nor loaded: the chunk ends
    before it (``awaits_store``) and takes nothing, so other requests use the step.
    """

    num_new_tokens: int
    to_encode: list[int] = field(default_factory=list)  # item indices (cache misses)
    to_reference: list[int] = field(default_factory=list)  # item indices found in the cache
    to_load: list[int] = field(default_factory=list)  # misses the encoder store returned
    num_embeddings_to_encode: int = 0
    num_embeddings_to_load: int = 0
    blocked_on_space: bool = False
    awaits_store: bool = False


@dataclass
class EncoderCommit:
    """The references a committed plan took, so a failed step can give them back."""

    referenced: list[str] = field(default_factory=list)  # keys whose reference is new
    allocated: list[str] = field(default_factory=list)  # keys allocated (to encode or load)
    hits: int = 0
    embeddings_saved: int = 0
    # (item index, its previous source) for each ``Request.mm_sources`` entry changed
    sources: list[tuple[int, EmbeddingSource | None]] = field(default_factory=list)


def plan_encoder_inputs(
    request: Request,
    num_new_tokens: int,
    cache: EncoderCacheManager,
    budget_left: int,
    disable_chunked_mm_input: bool,
    may_take_space: bool = True,
) -> EncoderPlan:
    """Walk the request's items that overlap [C, C + num_new_tokens) and shrink the chunk when
    one cannot be served. The result never has a negative token count; it is 0 when the
    computed position already sits inside an item that can be neither found nor encoded.
    ``may_take_space=False`` allows only entries some request already references."""
    start = request.num_computed_tokens
    plan = EncoderPlan(num_new_tokens)
    if not request.mm_items or request.mm_items[-1].end <= start:
        return plan  # text or decode past the last item: the common case, kept O(1)
    new_keys: set[str] = set()
    pinned: dict[str, int] = {}  # unreferenced entries this plan references: not evictable
    for idx, item in enumerate(request.mm_items):
        end = start + plan.num_new_tokens
        if item.offset >= end:
            break
        if item.end <= start:
            continue  # already in the KV cache
        if disable_chunked_mm_input and end < item.end:
            # never end a chunk inside an item; a start inside it (a prefix hit ending there)
            # waits for a step with room for the rest of the item
            plan.num_new_tokens = max(item.offset - start, 0)
            break
        key = item.key
        if key in new_keys or cache.contains(key):
            if key in cache.unreferenced and key not in pinned:
                # pinning it must not take the space the encodes planned so far rely on
                new_space = plan.num_embeddings_to_encode + plan.num_embeddings_to_load
                fits = cache.can_allocate(new_space + sum(pinned.values()) + item.length)
                if not (fits and may_take_space):
                    plan.num_new_tokens = max(item.offset - start, 0)
                    plan.blocked_on_space = True
                    break
                pinned[key] = item.length
            plan.to_reference.append(idx)
            continue
        if item.awaited is not None and item.stored is None:  # settled: so still pending
            plan.num_new_tokens = max(item.offset - start, 0)
            plan.awaits_store = True
            break
        space = plan.num_embeddings_to_encode + plan.num_embeddings_to_load + item.length
        needed = plan.num_embeddings_to_encode + item.length
        if item.stored is None and needed > budget_left:
            plan.num_new_tokens = max(item.offset - start, 0)
            break
        if not (may_take_space and cache.can_allocate(space + sum(pinned.values()))):
            plan.num_new_tokens = max(item.offset - start, 0)
            plan.blocked_on_space = True
            break
        if item.stored is not None:
            plan.to_load.append(idx)
            plan.num_embeddings_to_load += item.length
        else:
            plan.to_encode.append(idx)
            plan.num_embeddings_to_encode = needed
        new_keys.add(key)
    return plan


def commit_encoder_plan(
    request: Request, plan: EncoderPlan, cache: EncoderCacheManager, commit: EncoderCommit
) -> None:
    """Take the references the plan needs (cached entries first: allocating may evict),
    recording each in ``commit`` as it is taken."""
    new_keys = {request.mm_items[idx].key for idx in plan.to_encode + plan.to_load}
    for idx in plan.to_reference:
        item = request.mm_items[idx]
        _note_source(request, idx, EmbeddingSource.ENCODER_CACHE, commit)
        if item.key not in new_keys and cache.add_ref(item.key, request.req_id):
            commit.referenced.append(item.key)
            commit.hits += 1
            commit.embeddings_saved += item.length
    for source, indices in (
        (EmbeddingSource.ENCODED, plan.to_encode),
        (EmbeddingSource.ENCODER_STORE, plan.to_load),
    ):
        for idx in indices:
            item = request.mm_items[idx]
            _note_source(request, idx, source, commit)
            cache.allocate(item.key, request.req_id, item.length)
            commit.allocated.append(item.key)


def note_prefix_hits(request: Request, num_hit: int, commit: EncoderCommit) -> None:
    """At an admission (the first or a resume after preemption): the items wholly inside its
    prefix hit were served by the prefix cache (unless something costlier served them)."""
    for idx, item in enumerate(request.mm_items):
        if item.end > num_hit:
            break
        _note_source(request, idx, EmbeddingSource.PREFIX_CACHE, commit)


def _note_source(
    request: Request, idx: int, source: EmbeddingSource, commit: EncoderCommit
) -> None:
    previous = request.mm_sources[idx]
    if request.note_mm_source(idx, source):
        commit.sources.append((idx, previous))


def undo_encoder_commit(
    request: Request, commit: EncoderCommit, cache: EncoderCacheManager
) -> None:
    """Give back what ``commit_encoder_plan`` took (the allocations were never encoded) and
    forget the sources it recorded."""
    for key in reversed(commit.allocated):
        cache.discard(key)
    for key in reversed(commit.referenced):
        cache.release(key, request.req_id)
    for idx, previous in reversed(commit.sources):
        request.mm_sources[idx] = previous


def release_finished_occurrences(
    request: Request, num_scheduled: int, cache: EncoderCacheManager
) -> None:
    """After a step: release the items whose last token the step computed, unless an occurrence
    of the same image is still in progress (then that occurrence keeps the reference)."""
    computed = request.num_computed_tokens
    step_start = computed - num_scheduled
    if not request.mm_items or request.mm_items[-1].end <= step_start:
        return  # every item was finished before this step (e.g. decoding)
    finished: list[str] = []
    in_progress: set[str] = set()
    for item in request.mm_items:
        if item.offset >= computed:
            break
        if item.end > computed:
            in_progress.add(item.key)
        elif item.end > step_start:
            finished.append(item.key)
    for key in finished:
        if key not in in_progress:
            cache.release(key, request.req_id)


def note_worker_encodes(request: Request, num_scheduled: int, keys: frozenset[str]) -> None:
    """After a step that ran: the items in its range whose key the worker encoded though the
    plan loaded them or found them cached (``ModelRunnerOutput.encoded_instead``) were
    encoded."""
    if not keys:
        return
    start, end = request.num_computed_tokens - num_scheduled, request.num_computed_tokens
    for idx, item in enumerate(request.mm_items):
        if item.key in keys and item.offset < end and item.offset + item.length > start:
            request.note_mm_source(idx, EmbeddingSource.ENCODED)


def settle_store_waits(request: Request) -> None:
    """Before planning: each item whose wait for another replica's encode ended becomes a
    load of the stored embedding, or a plain miss (encode here) when it ended without one.
    A future that failed or was cancelled is a miss. Cheap once none is left
    (``Request.may_await_store``)."""
    if not request.may_await_store:
        return
    pending = False
    for idx, item in enumerate(request.mm_items):
        wait = item.awaited
        if wait is None:
            continue
        if not wait.done():
            pending = True
            continue
        ok = not wait.cancelled() and wait.exception() is None
        stored = wait.result() if ok else None
        request.mm_items[idx] = dataclasses.replace(item, stored=stored, awaited=None)
        request.may_hold_stored |= stored is not None
    request.may_await_store = pending


def drop_reached_stored(request: Request) -> None:
    """After a step that ran: the items the request has reached (their first token computed,
    in this step or in a prefix hit) stop holding the encoder store's host tensor, and so do
    the other occurrences of the same images. Their embeddings are in the encoder cache now
    (or in the KV cache); holding the host copy for the rest of the request doubled host
    memory. Items named by a media handle keep theirs (``MultiModalItem.by_handle``: without
    pixels, an eviction is answered by loading it again). Cheap once the request holds none
    to drop: ``Request.may_hold_stored`` is cleared."""
    if not request.may_hold_stored:
        return
    computed = request.num_computed_tokens
    reached = set()
    for item in request.mm_items:
        if item.offset >= computed:
            break
        reached.add(item.key)
    holds = False
    for idx, item in enumerate(request.mm_items):
        if item.stored is None or item.by_handle:  # a handle's item can only ever be loaded
            continue
        if item.key in reached:
            request.mm_items[idx] = dataclasses.replace(item, stored=None)
        else:
            holds = True
    request.may_hold_stored = holds
