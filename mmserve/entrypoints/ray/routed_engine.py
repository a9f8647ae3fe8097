"""``RoutedEngine``: the ingress' engine; admission here, generation on a replica."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from mmserve.engine.admission.pipeline import AdmissionExecutors
from mmserve.engine.errors import EngineOverloadedError, EngineShutdownError
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.metrics.engine_metrics import COUNTER_KEYS
from mmserve.engine.outputs import RequestOutput
from mmserve.entrypoints.ray.blanks import pack_blanks
from mmserve.entrypoints.ray.cluster_metrics import RoutingCollector, StatsRefresher
from mmserve.entrypoints.ray.counter_sums import ClusterCounterSums, ClusterStatsCollector
from mmserve.entrypoints.ray.frontend import NO_SHARED_STORE, FrontendEngine
from mmserve.entrypoints.ray.rendezvous import RouteKey, route_key
from mmserve.entrypoints.ray.routing_stats import ROUTING
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import HandleRecord, MediaHandleError, is_handle
from mmserve.multimodal.media.fetch import MediaFetcher
from mmserve.multimodal.workers import MediaWorkers
from mmserve.sampling_params import SamplingParams

STATS_TIMEOUT_S = 10.0
GAUGES_NOT_SUMMED = frozenset({"kv_block_size"})
REPLICA_COUNTERS = frozenset({"requests"})  # EngineReplica.stats' own counter


def unwrap_ray_error(exc: BaseException) -> BaseException:
    """The replica's own exception (its type and message map to the same HTTP answer as on a
    single server); a dead replica or Serve's back-pressure as the engine errors they mean."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, Exception):
        return exc.cause
    if isinstance(exc, BackPressureError):
        return EngineOverloadedError("the engine replicas are overloaded; retry later")
    if isinstance(exc, RayActorError):
        return EngineShutdownError("the engine replica serving this request stopped")
    return exc


class RoutedEngine(AsyncLLMEngine):
    """``AsyncLLMEngine`` as the OpenAI app sees it, backed by engine replicas.

    Admission runs here with the single server's code (fetch, decode, hash, preprocess,
    tokenize; its pools, memo and limits), so every image is hashed once, at the ingress; the
    admitted ``ProcessedPrompt`` (token ids, salted item keys, pixel tensors) goes to the replica
    the router picks from the prompt's ``RouteKey``. Replicas trust those keys because only this
    handle reaches them. There is no engine loop here: ``get_metrics`` is the replicas' sum as
    of the last ``cluster_stats`` call, which ``refresh_metrics`` (awaited by a ``/metrics``
    scrape, bounded by ``StatsRefresher``) makes; ``stats`` also exports the routing counts.
    """

    def __init__(
        self,
        frontend: FrontendEngine,
        replicas: DeploymentHandle,
        *,
        executors: AdmissionExecutors | None = None,
        fetcher: MediaFetcher | None = None,
        media_workers: MediaWorkers | None = None,
    ) -> None:
        super().__init__(
            frontend,  # type: ignore[arg-type]  # the LLMEngine surface admission reads
            start=False,
            executors=executors,
            fetcher=fetcher,
            media_workers=media_workers,
            admission=lambda: frontend,
        )
        self.frontend = frontend
        self.replicas = replicas
        self._started = False
        self._summed_at: float | None = None
        self._reporting = 0
        sums = ClusterCounterSums(COUNTER_KEYS | REPLICA_COUNTERS, not_summed=GAUGES_NOT_SUMMED)
        self._collector = ClusterStatsCollector(self.replica_stats, sums)
        self.refresh_metrics = StatsRefresher(self.cluster_stats)
        self.stats.registry.register(RoutingCollector(ROUTING.snapshot, self.freshness))

    def start(self, warm_up: bool = False) -> None:
        """No loop here (the replicas warm themselves up): the media workers only."""
        if not self._started and self.admission.media_workers is not None:
            self.admission.media_workers.start()
        self._started = True

    async def warm_up(self) -> None:
        await self.warm_up_media()

    def check_health(self) -> None:
        if self._draining:
            raise EngineShutdownError("the server is shutting down")
        if self.stopping or not self._started:
            raise EngineShutdownError("the server is not running (shutting down)")

    async def encode(self, prompt: PromptInput) -> list[HandleRecord]:
        """Encode-ahead: the images fetched, prepared and admitted here (a chat's limits and
        keys), encoded by the replica the first image's key routes to (as its chats will be),
        which answers once the handles' records are in the shared store. Without that store a
        handle could not be resolved anywhere else: ``media_handle_unsupported``."""
        self._check_admissible()
        frontend = self.frontend
        if frontend.handles is None:
            raise MediaHandleError(NO_SHARED_STORE, "media_handle_unsupported")
        ready = await self.admission.prepare(prompt)
        route = None  # a prompt encode refuses (no media, handles): the replica says so
        if ready.media and not any(map(is_handle, ready.media)):
            unnamed = functools.partial(frontend.process, name_uuids=False)  # once encoded
            processed = await self.run_text(unnamed, ready)
            route = route_key(processed, processed.cache_salt)
        try:
            blobs = await self.replicas.encode.remote(ready, route=route)
        except Exception as exc:
            raise unwrap_ray_error(exc) from None
        return [HandleRecord.from_bytes(blob) for blob in blobs]

    async def _dispatch(
        self, request_id: str, processed: ProcessedPrompt, params: SamplingParams, text: str | None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream the routed replica's outputs; closed before the finished one, it cancels the
        replica's stream, which aborts the request there. Ray errors come out unwrapped."""
        stream: DeploymentResponseGenerator | None = None
        finished = False
        try:
            route = route_key(processed, processed.cache_salt)
            call = self.replicas.options(stream=True).generate.remote(
                pack_blanks(processed), params, request_id, text, route=route
            )
            stream = cast(DeploymentResponseGenerator, call)  # stream=True
            async for out in stream:
                finished = finished or out.finished
                yield out
        except Exception as exc:
            raise unwrap_ray_error(exc) from None
        finally:
            if stream is not None and not finished:
                stream.cancel()

    async def replica_stats(self, replica: str) -> dict[str, Any]:
        call = self.replicas.stats.remote(route=RouteKey(pin=replica))
        stats = dict(await asyncio.wait_for(call, STATS_TIMEOUT_S))
        if stats.get("replica") != replica:  # it is gone; another one answered
            raise LookupError(f"replica {replica} is gone")
        return stats

    def freshness(self) -> dict[str, float]:
        """How many replicas the last sum has and its age in seconds (-1: none yet)."""
        age = -1.0 if self._summed_at is None else time.monotonic() - self._summed_at
        return {"replicas_reporting": self._reporting, "age_seconds": age}

    async def cluster_stats(self) -> dict[str, Any]:
        """Per-replica engine counters (encodes, cache hits, requests), their totals and this
        ingress' routing decisions. A replica that does not answer in time is left out of
        ``replicas``; the totals keep the counts of replicas that missed this refresh or are
        gone (``ClusterCounterSums``)."""
        routing = ROUTING.snapshot()
        replicas, total = await self._collector.collect(routing["replicas"])
        self._snapshot, self._summed_at, self._reporting = total, time.monotonic(), len(replicas)
        return {"replicas": replicas, "total": total, "routing": routing}
