"""``EngineReplica``: one mmserve engine as a Ray Serve replica (the class; ``app`` deploys it)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import torch

from mmserve.engine.admission.pipeline import AdmissionExecutors
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.ray.blanks import unpack_blanks
from mmserve.entrypoints.ray.frontend import ReplicaFacts
from mmserve.entrypoints.ray.rendezvous import RouteKey
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import handle_of
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
RECORDS_FLUSH_S = 10.0  # encode-ahead: the longest wait for its records' write to the store


def replica_id() -> str:
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)


class EngineReplica:
    """An ``LLMEngine`` and its loop thread, fed prompts the ingress admitted.

    Requests arrive as ``ProcessedPrompt`` (token ids, salted item keys, preprocessed pixels):
    the replica does not fetch, decode or hash again, and trusts the keys because only the
    ingress holds this deployment's handle (it has no HTTP route). Every ``EngineArgs`` field
    passes through unchanged (the encoder store's settings included). Ray Serve's health check
    is the engine's: a dead engine loop makes Serve replace the replica. ``route`` is read by
    the router only.
    """

    def __init__(
        self,
        engine_args: dict[str, Any],
        max_queued_requests: int | None = None,
        torch_threads: int | None = None,
        warm_up: bool = True,
    ) -> None:
        if torch_threads:
            torch.set_num_threads(torch_threads)
        settings = EngineArgs(**engine_args)
        no_media = MediaFetchPolicy(allowed_local_path=None)  # pixels come from the ingress
        self.llm = LLMEngine.from_engine_args(settings, media_policy=no_media)
        self.engine = AsyncLLMEngine(
            self.llm,
            max_queued_requests=max_queued_requests,
            start=False,
            executors=AdmissionExecutors(1, 1),
        )
        self.engine.start(warm_up)
        self.engine.wait_warm()  # before Serve counts the replica as started
        self.requests = 0
        logger.info("engine replica %s ready (%s)", replica_id(), settings.model)

    def describe(self, route: RouteKey | None = None) -> dict[str, int]:
        store = self.llm.store
        facts = ReplicaFacts(
            vocab_size=self.llm.vocab_size,
            encoder_cache_capacity=self.llm.scheduler.encoder_cache.capacity,
            encoder_budget=self.llm.encoder_budget,
            store_fingerprint=None if store is None else store.keyer.fingerprint,
        )
        return dataclasses.asdict(facts)

    async def generate(
        self,
        processed: ProcessedPrompt,
        params: SamplingParams,
        request_id: str,
        prompt_text: str | None,
        route: RouteKey | None = None,
    ) -> AsyncIterator[RequestOutput]:
        self.requests += 1
        # what RequestIntake.process + AdmissionPipeline.admit do for a local prompt (the
        # ingress has no store lookups): the embeddings of the media handles the ingress
        # resolved (MediaHandleError if gone), then the shared store, up to its deadline
        unpack_blanks(processed)
        used = {handle_of(item.hash) for item in processed.mm_items if item.by_handle}
        found = None
        if used:
            found = await self.engine.run_text(self.llm.handles.embeddings, processed, used)
        self.llm.intake.start_store_lookup(processed, found)
        await self.engine.admission.wait_for_store(processed)
        prompt = PromptInput(prompt_text if prompt_text is not None else processed.prompt_token_ids)
        async for out in self.engine.generate(prompt, params, request_id, processed=processed):
            yield out

    async def encode(self, ready: PromptInput, route: RouteKey | None = None) -> list[bytes]:
        """Encode-ahead of a prompt the ingress prepared (``AsyncLLMEngine.encode_prepared``);
        answers once its handles' records are in the shared store (so any replica and the
        ingress resolve them), as ``HandleRecord.to_bytes`` (compact: no blanked arrays)."""
        records = await self.engine.encode_prepared(ready)
        store = self.llm.store
        if store is not None and not await asyncio.to_thread(store.flush, RECORDS_FLUSH_S):
            logger.warning("encoder store: handle records still queued after %ss", RECORDS_FLUSH_S)
        return [record.to_bytes() for record in records]

    def stats(self, route: RouteKey | None = None) -> dict[str, Any]:
        """This replica's engine counters (``mmserve_*`` metric names without the prefix)."""
        return {"replica": replica_id(), "requests": self.requests, **self.engine.get_metrics()}

    def check_health(self) -> None:
        self.engine.check_health()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
