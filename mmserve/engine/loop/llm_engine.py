"""LLMEngine: assembly, admission (via ``RequestIntake``), step = schedule -> execute -> update."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.core.progress import ProgressMonitor
from mmserve.engine.admission.grammar import GrammarCompiler
from mmserve.engine.admission.handles import HandleBook
from mmserve.engine.admission.intake import RequestIntake
from mmserve.engine.errors import EngineDeadError
from mmserve.engine.loop.encode_ahead import encode_ahead
from mmserve.engine.loop.stall import default_stall_steps, fail_if_stalled
from mmserve.engine.loop.step_isolation import IsolatingStepper, StepResult
from mmserve.engine.loop.warmup import WarmupReport, run_warmup_request
from mmserve.engine.metrics.engine_metrics import read_engine_metrics
from mmserve.engine.output.detokenizer import Detokenizer
from mmserve.engine.output.fanout import FanOut
from mmserve.engine.output.output_processor import OutputProcessor
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.setup.cache_setup import allocate_kv_cache, build_scheduler, size_caches
from mmserve.engine.setup.graph_setup import build_decode_graphs, usable_graph_config
from mmserve.engine.setup.loading import create_engine_config, load_model, torch_dtype
from mmserve.engine.setup.malloc_tuning import tune_malloc
from mmserve.engine.setup.model_front import ModelFront
from mmserve.engine_args import EngineArgs
from mmserve.inputs import MultiModalItem, PromptInput
from mmserve.layers.attention import select_attention_backend
from mmserve.multimodal.handles import HandleRecord
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.request import Request, RequestStatus
from mmserve.sampling_params import SamplingParams
from mmserve.store import EncoderStore, open_encoder_store
from mmserve.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)
STORE_WAIT_IDLE_S = 0.01  # the longest an idle step sleeps for another replica's encode


class LLMEngine:
    """One model, one scheduler, one runner; not thread-safe (the async engine serializes)."""

    def __init__(
        self,
        config: EngineConfig,
        device: str | None = None,
        allowed_local_path: Any = True,
        media_policy: MediaFetchPolicy | None = None,
    ) -> None:
        """``device`` overrides ``config.device``; ``media_policy`` says which image URLs /
        files may be read (default: public URLs, and local files as ``allowed_local_path``
        says: True any, a directory below it)."""
        tune_malloc()  # opt-in: glibc keeps freed memory (MMSERVE_MALLOC_TUNING=1)
        self.config = config
        mc = config.model
        torch.manual_seed(config.seed)
        self.device = torch.device(device or config.device)
        front = ModelFront.load(
            config, media_policy or MediaFetchPolicy(allowed_local_path=allowed_local_path)
        )
        self.front = front
        self.tokenizer, self.processor = front.tokenizer, front.processor
        self.chat_template = front.chat_template
        self.generation_defaults = front.generation_defaults
        self.detokenizer = Detokenizer(self.tokenizer)
        self.model = load_model(mc, self.device)
        with torch.inference_mode():  # the logits width, which token ids in requests must fit
            probe = torch.zeros(1, mc.hidden_size, dtype=torch_dtype(mc.dtype), device=self.device)
            self.vocab_size = int(self.model.compute_logits(probe).shape[-1])
        self.grammar = GrammarCompiler(self.tokenizer, self.vocab_size, mc.eos_token_ids)
        graph_config = usable_graph_config(config, self.model)
        sizes = size_caches(config, self.model, self.device, self.processor, graph_config)
        self.max_model_len = mc.max_model_len
        # with decode graphs, one block more than the scheduler's: the padding rows' pad block
        spare = 0 if graph_config is None else 1
        self.kv_cache = allocate_kv_cache(
            config, self.model, self.device, sizes.num_kv_blocks + spare
        )
        self.decode_graphs = build_decode_graphs(
            graph_config, self.model, self.kv_cache, sizes.num_kv_blocks, self.device
        )
        self._sizes = sizes
        self._backend = select_attention_backend(
            config.attention_backend,
            self.device,
            torch_dtype(mc.dtype),
            self.model.head_dim,
            self.model.attention_masks,
        )
        self.store: EncoderStore | None = None
        if config.encoder_store is not None:
            self.store = open_encoder_store(
                config.encoder_store, mc.path, mc.dtype, torch_dtype(mc.dtype)
            )
        self.dead: BaseException | None = None
        store_timeout_s = 0.0 if config.encoder_store is None else config.encoder_store.timeout_ms
        self.handles = HandleBook(
            self.processor, self.store, self._host_embedding, store_timeout_s / 1000
        )
        self._assemble_loop(self.store)

    def _assemble_loop(self, store: EncoderStore | None) -> None:
        """A fresh scheduler and runner and the bookkeeping around them (``warm_up`` steps its
        request on one such set, then assembles the set that serves)."""
        config, mc = self.config, self.config.model
        self.scheduler = build_scheduler(config, self._sizes)
        self.runner = ModelRunner(
            self.model,
            self.kv_cache,
            self.device,
            config.seed,
            self._backend,
            frozenset(mc.eos_token_ids),
            self.decode_graphs,
        )
        self.runner.encoder.sink = store
        self.scheduler.on_finish = self._request_ended
        self.stepper = IsolatingStepper(self.scheduler, self.runner)
        self.progress = ProgressMonitor(config.scheduler.stall_steps or default_stall_steps(config))
        self.outputs = OutputProcessor(self.detokenizer, self.scheduler.finish_requests)
        self.fanout = FanOut()
        self.intake = RequestIntake(
            config,
            self.front,
            store,
            self.scheduler,
            self.outputs,
            self.fanout,
            self.grammar,
            self.vocab_size,
            self.handles,
        )

    def warm_up(self) -> WarmupReport:
        """Run ``run_warmup_request`` on throwaway loop parts without the encoder store, then
        assemble fresh ones: the first-call costs are paid now, while the metrics, the caches
        and the store see nothing of it. Servers call it before they serve (nothing else may
        hold the loop parts yet)."""
        if self.has_unfinished_requests():
            raise RuntimeError("warm_up runs before any request")
        started = time.perf_counter()
        self._assemble_loop(None)
        try:
            report = run_warmup_request(self)
        finally:
            self._assemble_loop(self.store)
        logger.info(
            "warm-up took %.2f s (%d image(s) encoded, %d prompt tokens, %d generated)",
            time.perf_counter() - started,
            report.images_encoded,
            report.prompt_tokens,
            report.output_tokens,
        )
        return report

    @property
    def encoder_budget(self) -> int:
        """Embeddings the vision encoder may compute per step; admission refuses any item
        larger (the scheduler's budget: one value, read by both)."""
        return self.scheduler.encoder_compute_budget

    @encoder_budget.setter
    def encoder_budget(self, value: int) -> None:
        self.scheduler.encoder_compute_budget = value

    @classmethod
    def from_args(
        cls,
        model: str | None = None,
        *,
        allowed_local_path: Any = True,
        media_policy: MediaFetchPolicy | None = None,
        **engine_args: Any,
    ) -> LLMEngine:
        """``engine_args``: ``EngineArgs`` fields by name (ValueError for unknown ones)."""
        return cls.from_engine_args(
            EngineArgs.from_kwargs(model, **engine_args), allowed_local_path, media_policy
        )

    @classmethod
    def from_engine_args(
        cls,
        args: EngineArgs,
        allowed_local_path: Any = True,
        media_policy: MediaFetchPolicy | None = None,
    ) -> LLMEngine:
        return cls(create_engine_config(args), None, allowed_local_path, media_policy)

    # ---- admission: ``self.intake`` (``RequestIntake``) -----------------------------------
    def default_sampling_params(self) -> SamplingParams:
        return self.front.default_sampling_params()

    def add_request(
        self, prompt: PromptInput, params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Process ``prompt``, wait for its store lookups and queue it (blocking: the offline
        path, never on an engine thread another caller steps)."""
        processed = self.intake.process(prompt)
        self.intake.wait_for_store([processed])
        text = prompt.prompt if isinstance(prompt.prompt, str) else None
        return self.intake.add_processed(processed, params, request_id, text, prompt.cache_salt)

    # ---- encode-ahead: media handles (``HandleBook``) ---------------------------------------
    def encode(self, prompt: PromptInput) -> list[HandleRecord]:
        """Admit an encode-only prompt (its images), encode what no cache or store tier holds
        and register their handles (blocking: the offline path; the server runs the parts on
        its threads, ``AsyncLLMEngine.encode``)."""
        processed, records = self.intake.admit_encode(prompt)
        self.intake.wait_for_store([processed])
        # all at once: offline, no request waits on this thread (the server encodes a budget
        # per loop turn, ``EncodeQueue``)
        self.encode_items(self.intake.take_store_hits(processed))
        self.handles.register(records, prompt)
        return records

    def encode_items(self, items: list[MultiModalItem]) -> int:
        """``encode_ahead`` of ``items`` (store hits attached); returns the images encoded."""
        return encode_ahead(self.scheduler, self.runner, items)

    def _host_embedding(self, item_key: str) -> torch.Tensor | None:
        """The encoder cache's embedding of ``item_key`` on the host, if it holds one (read from
        admission threads: a dict lookup, then a copy the cache's evictions cannot touch)."""
        emb = self.runner.encoder.embeddings.get(item_key)
        if emb is None or emb.device.type == "cpu":
            return emb
        return emb.to("cpu")

    def _request_ended(self, request: Request) -> None:
        """Give back the encode leases held for ``request`` alone: those of items it ended
        before encoding (aborted, failed), so the replicas waiting for them encode now."""
        store = self.store
        if store is None or store.lease is None or not store.lease.holding:
            return
        live = {item.key for other in self.scheduler.requests.values() for item in other.mm_items}
        store.abandoned([item.key for item in request.mm_items if item.key not in live])

    def abort_request(self, req_ids: list[str]) -> None:
        """Abort requests by id; the id of an ``n > 1`` request aborts all its children."""
        req_ids = self.fanout.expand(req_ids)
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)
        for req_id in req_ids:
            self.outputs.forget(req_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- stepping ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step. A request whose input breaks the step, or that cannot progress, ends
        alone with finish reason "error"; only a fatal error raises (``EngineDeadError``)."""
        result = self._schedule_and_execute()
        outputs = [self.outputs.make_output(request) for request in result.updated]
        outputs += [self.outputs.error_output(request, why) for request, why in result.failed]
        outputs += fail_if_stalled(self, result, sum(out.finished for out in outputs))
        merged, orphans = self.fanout.merge(outputs)
        if orphans:  # siblings of a child that failed: the parent has ended
            self.abort_request(orphans)
        return merged

    def _schedule_and_execute(self) -> StepResult:
        """One isolating step; when nothing ran because every request able to run is held
        at an item another replica is encoding, sleep until a store wait ends (briefly: no
        busy loop, and the async engine's next commands are applied soon)."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead}")
        try:
            result = self.stepper.step()
        except EngineDeadError as exc:
            self.dead = exc
            self.abort_request(list(self.scheduler.requests))
            raise
        if not result.ran and self.scheduler.held_for_store and self.store is not None:
            self.store.waits.wait_for_change(STORE_WAIT_IDLE_S)
        return result

    def close(self) -> None:
        """Finish the encoder store's queued writes and stop its threads (if there is one)."""
        if self.store is not None:
            self.store.close()

    def get_metrics(self) -> dict[str, float]:
        """Every metric of ``engine_metrics.ENGINE_METRICS`` (names and help live there)."""
        return read_engine_metrics(self)
