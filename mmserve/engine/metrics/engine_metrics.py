"""Every engine metric, named once: its kind, its help text and where its value comes from.

``LLMEngine.get_metrics`` evaluates this table, and the Prometheus export
(``engine.metrics``) takes counter-ness and help texts from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mmserve.store.metrics import STORE_FIELDS, TIERS

Engine = Any  # an LLMEngine (not imported: it imports this table)


@dataclass(frozen=True)
class EngineMetric:
    name: str
    kind: Literal["counter", "gauge"]
    help: str
    read: Callable[[Engine], float]


def _sched(key: str) -> Callable[[Engine], float]:
    return lambda e: e.scheduler.counters[key]


def _store(key: str) -> Callable[[Engine], float]:
    return lambda e: 0 if e.store is None else e.store.metrics.get(key)


_TIER_HELP = {
    "hits": "Encoder store {} lookups that returned a verified embedding.",
    "misses": "Encoder store {} lookups that found nothing usable (invalid entries included).",
    "errors": "Encoder store {} calls that failed or were skipped (tier down).",
    "bytes": "Bytes read from the encoder store {} tier on hits.",
    "lookup_seconds": "Seconds spent in encoder store {} lookups.",
}
_STORE_HELP = {
    "writes": "Encoder outputs written to the encoder store's disk / Redis tiers.",
    "writes_dropped": "Encoder store writes dropped because the write-behind queue was full.",
    "write_errors": "Encoder store write jobs that raised.",
    "mac_failures": "Encoder store entries whose MAC did not verify (deleted, re-encoded).",
    "corrupt_entries": "Encoder store entries that failed verification (deleted, re-encoded).",
    "late_lookups": "Encoder store lookups still pending at their deadline (encoded instead).",
    "lease_acquired": "Items this replica missed everywhere and took the encode lease for.",
    "lease_waits": "Items another replica held the encode lease for: waited for, not encoded.",
    "lease_loaded": "Waits for another replica's encode that ended with its stored result.",
    "lease_takeovers": "Waits that ended without a stored result: encoded here instead.",
}
STORE_METRICS: tuple[EngineMetric, ...] = tuple(
    EngineMetric(f"encoder_store_{tier}_{field}", "counter", text.format(tier),
                 _store(f"{tier}_{field}"))
    for tier in TIERS
    for field, text in _TIER_HELP.items()
) + tuple(
    EngineMetric(f"encoder_store_{name}", "counter", _STORE_HELP[name], _store(name))
    for name in STORE_FIELDS
) + (
    EngineMetric("encoder_store_loads", "counter",
                 "Images scheduled as loads of an encoder store hit (no encoder work).",
                 _sched("encoder_store_loads")),
    EngineMetric("encoder_images_loaded", "counter",
                 "Images whose embeddings the worker copied in from the encoder store.",
                 lambda e: e.runner.encoder.num_images_loaded),
    EngineMetric("encoder_store_load_failures", "counter",
                 "Scheduled loads whose stored embedding did not fit (encoded instead).",
                 lambda e: e.runner.encoder.num_load_failures),
)  # fmt: skip


ENGINE_METRICS: tuple[EngineMetric, ...] = (
    EngineMetric("kv_blocks_total", "gauge", "KV cache blocks in the pool.",
                 lambda e: e.scheduler.kv.pool.num_blocks),
    EngineMetric("kv_blocks_used", "gauge", "KV cache blocks referenced by live requests.",
                 lambda e: e.scheduler.kv.pool.num_used_blocks),
    EngineMetric("kv_block_size", "gauge", "Tokens per KV cache block.",
                 lambda e: e.config.cache.block_size),
    EngineMetric("num_requests_running", "gauge", "Requests in the running batch.",
                 lambda e: len(e.scheduler.running)),
    EngineMetric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
                 lambda e: len(e.scheduler.waiting)),
    EngineMetric("num_preemptions", "counter",
                 "Preemptions (KV blocks reclaimed from a running request).",
                 _sched("num_preemptions")),
    EngineMetric("prompt_tokens", "counter",
                 "Prompt tokens admitted (image placeholders included).",
                 lambda e: e.intake.num_prompt_tokens),
    EngineMetric("generation_tokens", "counter", "Tokens generated.",
                 _sched("generation_tokens")),
    EngineMetric("encoder_cache_hits", "counter", "Images found in the encoder cache.",
                 _sched("encoder_cache_hits")),
    EngineMetric("encoder_cache_misses", "counter", "Images scheduled for encoding.",
                 _sched("encoder_cache_misses")),
    EngineMetric("encoder_cache_evictions", "counter", "Encoder cache entries evicted.",
                 lambda e: e.scheduler.encoder_cache.num_evictions),
    EngineMetric("encoder_embeddings_computed", "counter",
                 "Image embeddings computed by the vision encoder.",
                 lambda e: e.runner.encoder.num_embeddings_computed),
    EngineMetric("encoder_embeddings_from_cache", "counter",
                 "Image embeddings served from the encoder cache.",
                 _sched("encoder_embeddings_from_cache")),
    EngineMetric("encoder_images_encoded", "counter",
                 "Images and video frame groups run through the vision encoder.",
                 lambda e: e.runner.encoder.num_images_encoded),
    EngineMetric("encoder_cache_bytes", "gauge", "Bytes held by the encoder cache.",
                 lambda e: e.scheduler.encoder_cache.num_bytes),
    EngineMetric("encoder_cache_capacity", "gauge", "Encoder cache capacity in embeddings.",
                 lambda e: e.scheduler.encoder_cache.capacity),
    EngineMetric("encoder_cache_references", "gauge",
                 "Live request references to encoder cache entries.",
                 lambda e: sum(len(r) for r in e.scheduler.encoder_cache.referenced.values())),
    EngineMetric("encoder_gather_misses", "gauge",
                 "Embeddings missing at gather time and encoded again (should stay 0).",
                 lambda e: e.runner.encoder.num_gather_misses),
    EngineMetric("encoder_seconds", "counter", "Seconds spent in the vision encoder.",
                 lambda e: e.runner.encoder.encoder_seconds),
    EngineMetric("prefix_cache_queries", "counter", "Prompt blocks looked up in the prefix cache.",
                 lambda e: e.scheduler.kv.prefix_cache_queries),
    EngineMetric("prefix_cache_hits", "counter", "Prompt blocks found in the prefix cache.",
                 lambda e: e.scheduler.kv.prefix_cache_hits),
    *STORE_METRICS,
)  # fmt: skip

COUNTER_KEYS = frozenset(m.name for m in ENGINE_METRICS if m.kind == "counter")
DESCRIPTIONS = {m.name: m.help for m in ENGINE_METRICS}


def read_engine_metrics(engine: Engine) -> dict[str, float]:
    return {m.name: m.read(engine) for m in ENGINE_METRICS}
