"""Encode-ahead: an encode-only request's images into the encoder cache, between steps."""

from __future__ import annotations

from collections.abc import Sequence

from mmserve.core.scheduler import Scheduler
from mmserve.inputs import MultiModalItem
from mmserve.worker.model_runner import ModelRunner

OWNER = "encode-ahead"  # the reference an encode-ahead entry holds while it is computed


def encode_ahead(scheduler: Scheduler, runner: ModelRunner, items: Sequence[MultiModalItem]) -> int:
    """Put ``items`` (store hits attached as ``stored``) in the encoder cache: found ones are
    refreshed, stored ones loaded, the rest encoded in one batched call; each new entry is then
    released, so it is the newest unreferenced (evictable) entry. Returns how many were encoded.

    Runs on the engine thread between steps (the scheduler's and the runner's caches change
    together, as a step changes them): entries it evicts are dropped from the runner at once,
    and if encoding raises, its allocations are discarded. An item the cache cannot hold now
    (every entry referenced by running requests) is still encoded, so the encoder store gets
    it, and dropped. The encoder metrics count it as a step's encodes and hits are counted.
    """
    cache, encoder = scheduler.encoder_cache, runner.encoder
    unique = list({item.key: item for item in items}.values())
    to_load, to_encode, allocated, uncached = [], [], [], []
    for item in unique:
        if cache.contains(item.key):
            cache.add_ref(item.key, OWNER)  # refreshes its place in the LRU on release
            cache.release(item.key, OWNER)
            scheduler.counters["encoder_cache_hits"] += 1
            scheduler.counters["encoder_embeddings_from_cache"] += item.length
            continue
        if cache.can_allocate(item.length):
            cache.allocate(item.key, OWNER, item.length)
            allocated.append(item.key)
        else:
            uncached.append(item.key)
        if item.stored is not None:
            to_load.append(item)
            scheduler.counters["encoder_store_loads"] += 1
        else:
            to_encode.append(item)
            scheduler.counters["encoder_cache_misses"] += 1
    encoder.evict(cache.take_freed())
    encoder.begin_step()
    before = encoder.num_images_encoded
    try:
        to_encode += encoder.load(to_load)  # a stored one that does not fit is encoded
        encoder.encode(to_encode)
    except BaseException:
        encoder.drop_step_encodes()
        for key in allocated:
            cache.discard(key)
        cache.take_freed()
        raise
    for key in allocated:
        cache.release(key, OWNER)
    encoder.evict(cache.take_freed())  # with the encoder cache off, released is evicted
    encoder.drop(uncached)
    return encoder.num_images_encoded - before
