"""vLLM's metric names for the engine metrics that have a vLLM counterpart.

Existing Grafana dashboards for vLLM read ``vllm:*`` families with a ``model_name`` label; this
collector exports the engine snapshot's counterparts under those names (the ``mmserve_*``
families stay, with the encoder-cache metrics vLLM lacks). Units follow vLLM: the prefix-cache
counters count tokens (mmserve counts full blocks, so block counts x block size), KV usage is a
fraction in [0, 1].
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

# vLLM name (without the _total of counters), kind, help, snapshot -> value
_FAMILIES: tuple[tuple[str, str, str, Callable[[Mapping[str, float]], float]], ...] = (
    ("vllm:num_requests_running", "gauge", "Number of requests in the running batch.",
     lambda s: s["num_requests_running"]),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be scheduled.",
     lambda s: s["num_requests_waiting"]),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
     lambda s: s["kv_blocks_used"] / s["kv_blocks_total"] if s["kv_blocks_total"] else 0.0),
    ("vllm:prefix_cache_queries", "counter",
     "Prefix cache queries, in tokens (full blocks looked up x block size).",
     lambda s: s["prefix_cache_queries"] * s["kv_block_size"]),
    ("vllm:prefix_cache_hits", "counter",
     "Prefix cache hits, in tokens (full blocks found x block size).",
     lambda s: s["prefix_cache_hits"] * s["kv_block_size"]),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemptions.",
     lambda s: s["num_preemptions"]),
    ("vllm:prompt_tokens", "counter", "Number of prompt tokens admitted (image tokens included).",
     lambda s: s["prompt_tokens"]),
    ("vllm:generation_tokens", "counter", "Number of generated tokens.",
     lambda s: s["generation_tokens"]),
)  # fmt: skip


class VLLMSnapshotCollector(Collector):
    """Exports an engine metrics snapshot under vLLM's names, labelled with the model name."""

    def __init__(
        self, snapshot: Callable[[], Mapping[str, Any]], model_name: Callable[[], str]
    ) -> None:
        self._snapshot = snapshot
        self._model_name = model_name

    def describe(self) -> list[Metric]:
        return []  # registering must not read the engine

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = dict(self._snapshot())
        except Exception:  # a scrape must never fail because of a bad snapshot
            logger.exception("reading the engine metrics snapshot failed")
            return
        labels = [self._model_name()]
        for name, kind, doc, read in _FAMILIES:
            try:
                value = float(read(snapshot))
            except (KeyError, TypeError):
                continue  # an engine without that metric
            family_cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_cls(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            yield family
