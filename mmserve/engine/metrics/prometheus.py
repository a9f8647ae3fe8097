"""Prometheus export: the engine's metrics snapshot plus server-side latency histograms.

Every numeric key of ``LLMEngine.get_metrics()`` is exported generically as ``mmserve_<key>``:
keys in ``COUNTER_KEYS`` become counters (``mmserve_<key>_total``), every other key (including
keys the engine adds later) a gauge. The snapshot is read through a callable, so the collector
never touches engine state itself (the async engine publishes snapshots from its own thread).
Each ``ServerMetrics`` owns its own ``CollectorRegistry``: several servers can live in one
process (tests) without duplicate-name errors.

Beside them, the metrics vLLM also has are exported under vLLM's names with a ``model_name``
label (``vllm_metrics`` for the engine's; the request histograms and ``vllm:request_success``
here), so dashboards built for vLLM work unchanged.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mmserve.engine.metrics.engine_metrics import COUNTER_KEYS, DESCRIPTIONS
from mmserve.engine.metrics.vllm_metrics import VLLMSnapshotCollector

logger = logging.getLogger(__name__)

PREFIX = "mmserve_"

# fmt: off
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)
# fmt: on

# Names of the metrics ServerMetrics defines; an engine key mapping onto one is not exported.
SERVER_METRIC_NAMES = frozenset(
    {
        "mmserve_time_to_first_token_seconds",
        "mmserve_inter_token_latency_seconds",
        "mmserve_e2e_request_latency_seconds",
        "mmserve_requests_finished",
        "mmserve_http_requests",
    }
)

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(key: str) -> str:
    """``mmserve_`` + the key with characters Prometheus does not allow replaced by ``_``."""
    name = PREFIX + _INVALID.sub("_", key)
    return name.removesuffix("_total") if key in COUNTER_KEYS else name


class EngineSnapshotCollector(Collector):
    """Exports a metrics snapshot dict; non-numeric values and reserved names are skipped."""

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, Any]],
        reserved: frozenset[str] = frozenset(),
    ) -> None:
        self._snapshot = snapshot
        self._reserved = reserved

    def describe(self) -> list[Metric]:
        return []  # names are dynamic; registering must not read the engine

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = dict(self._snapshot())
        except Exception:  # a scrape must never fail because of a bad snapshot
            logger.exception("reading the engine metrics snapshot failed")
            return
        for key in sorted(snapshot):
            value = snapshot[key]
            if not isinstance(value, (int, float)):
                continue
            name = metric_name(key)
            if name in self._reserved:
                continue
            doc = DESCRIPTIONS.get(key, f"Engine metric {key}.")
            if key in COUNTER_KEYS:
                yield CounterMetricFamily(name, doc, value=float(value))
            else:
                yield GaugeMetricFamily(name, doc, value=float(value))


# finish reasons vLLM's request_success counts (not "rejected": never admitted)
_SUCCESS_REASONS = frozenset({"stop", "length", "abort", "error"})


class ServerMetrics:
    """Registry with the engine snapshot collectors, latency histograms and request counters
    (mmserve's names, and vLLM's labelled with the served model name)."""

    def __init__(
        self, snapshot: Callable[[], Mapping[str, Any]], model_name: str = "mmserve"
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.model_name = model_name
        self._vllm_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self._vllm_itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self._vllm_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self._vllm_success = Counter(
            "vllm:request_success",
            "Count of finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        reg.register(VLLMSnapshotCollector(snapshot, lambda: self.model_name))
        self.time_to_first_token = Histogram(
            "mmserve_time_to_first_token_seconds",
            "Seconds from request arrival (before image loading) to its first token.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.inter_token_latency = Histogram(
            "mmserve_inter_token_latency_seconds",
            "Seconds between consecutive output tokens of a request.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e_latency = Histogram(
            "mmserve_e2e_request_latency_seconds",
            "Seconds from request arrival to its end (any outcome).",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.requests_finished = Counter(
            "mmserve_requests_finished",
            "Generation requests by outcome (stop, length, abort, rejected, error).",
            ["finish_reason"],
            registry=reg,
        )
        self.http_requests = Counter(
            "mmserve_http_requests",
            "HTTP responses by endpoint and status code.",
            ["endpoint", "status"],
            registry=reg,
        )
        reg.register(EngineSnapshotCollector(snapshot, SERVER_METRIC_NAMES))

    def set_model_name(self, name: str) -> None:
        """The ``model_name`` label of the vLLM families (the first served name)."""
        old, self.model_name = self.model_name, name
        for metric in (self._vllm_ttft, self._vllm_itl, self._vllm_e2e):
            if old != name:
                try:
                    metric.remove(old)
                except KeyError:
                    pass
            metric.labels(model_name=name)  # exported at 0 before the first request

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)
        self._vllm_ttft.labels(model_name=self.model_name).observe(seconds)

    def observe_inter_token(self, seconds: float, num_tokens: int) -> None:
        """``num_tokens`` arrived together ``seconds`` after the previous output."""
        per_token = seconds / max(1, num_tokens)
        vllm_itl = self._vllm_itl.labels(model_name=self.model_name)
        for _ in range(num_tokens):
            self.inter_token_latency.observe(per_token)
            vllm_itl.observe(per_token)

    def observe_finished(self, reason: str, seconds: float) -> None:
        self.requests_finished.labels(finish_reason=reason).inc()
        self.e2e_latency.observe(seconds)
        self._vllm_e2e.labels(model_name=self.model_name).observe(seconds)
        if reason in _SUCCESS_REASONS:
            self._vllm_success.labels(model_name=self.model_name, finished_reason=reason).inc()

    def observe_http(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)


class RequestTimer:
    """Latency bookkeeping of one request: TTFT, inter-token latency, end-to-end latency."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = self.last = time.monotonic()
        self.num_tokens = 0

    def on_output(self, num_tokens: int) -> None:
        """The request now has ``num_tokens`` output tokens in total."""
        now, new = time.monotonic(), num_tokens - self.num_tokens
        if new <= 0:
            return
        if self.num_tokens == 0:
            self.metrics.observe_first_token(now - self.start)
            new -= 1
        if new > 0:
            self.metrics.observe_inter_token(now - self.last, new)
        self.num_tokens, self.last = num_tokens, now

    def finish(self, reason: str) -> None:
        self.metrics.observe_finished(reason, time.monotonic() - self.start)
