"""RequestIntake: a PromptInput -> ProcessedPrompt (store lookups started) -> Request(s)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from mmserve.config import EngineConfig
from mmserve.core.scheduler import Scheduler
from mmserve.engine.admission.embeds import prepare_embeds, supply_embeds
from mmserve.engine.admission.grammar import GrammarCompiler
from mmserve.engine.admission.handles import HandleBook
from mmserve.engine.admission.prompt_limits import checked_prompt
from mmserve.engine.output.fanout import FanOut, child_params
from mmserve.engine.output.output_processor import OutputProcessor
from mmserve.engine.setup.generation_defaults import default_max_tokens
from mmserve.engine.setup.loading import torch_dtype
from mmserve.engine.setup.model_front import ModelFront
from mmserve.inputs import ImageEmbeds, MultiModalItem, ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import HandleRecord, is_handle
from mmserve.request import Request
from mmserve.sampling_params import SamplingParams
from mmserve.store import EncoderStore, StoreLookup
from mmserve.store.metrics import StoreMetrics


class RequestIntake:
    """The engine's ``Admission`` (``engine.admission``) and what follows it: ``process``
    (thread-safe: tokenize, preprocess, check the prompt fits, start its encoder-store lookups)
    and ``add_processed`` (engine thread: check the parameters, attach the store hits, queue
    one request or ``n`` children). ``num_prompt_tokens`` counts the prompt tokens of every
    queued prompt. ``LLMEngine.warm_up`` replaces it: hold the engine, not its intake."""

    def __init__(
        self,
        config: EngineConfig,
        front: ModelFront,
        store: EncoderStore | None,
        scheduler: Scheduler,
        outputs: OutputProcessor,
        fanout: FanOut,
        grammar: GrammarCompiler,
        vocab_size: int,
        handles: HandleBook,
    ) -> None:
        self.config = config
        self.handles = handles
        self.front = front
        self.store = store
        self.scheduler = scheduler
        self.outputs = outputs
        self.fanout = fanout
        self.grammar = grammar
        self.vocab_size = vocab_size
        self.max_model_len = config.model.max_model_len
        self.num_prompt_tokens = 0
        self._ids = itertools.count()

    # ---- PromptInput -> ProcessedPrompt ---------------------------------------------------
    def process(self, prompt: PromptInput, *, name_uuids: bool = True) -> ProcessedPrompt:
        """Tokenize, load, hash and preprocess (thread-safe; the server runs it off-loop), check
        it fits (``prompt_limits``) and start its store lookups. ``prompt.videos``: decoded
        videos (``VideoFrames``, PIL frame lists, arrays) or ``PreparedVideo``s, one item per
        frame group. ``prompt.cache_salt`` scopes the items' encoder-cache keys (and, at
        ``add_processed``, the prefix-cache block hashes) to one tenant;
        ``prompt.mm_processor_kwargs`` override the engine's processor settings for its images
        and videos (part of their keys). Images sent with data and a ``uuid`` are registered
        under it once admitted (``name_uuids``; encode-ahead registers its own once encoded)."""
        prompt, handles = self.handles.resolve(prompt)  # media handles: their records' images
        mc = self.front.processor.model_config
        width = mc.embedding_width or mc.hidden_size
        prompt, embeds = prepare_embeds(self.front.processor, prompt, torch_dtype(mc.dtype), width)
        prompt, named = self.handles.named(prompt) if name_uuids else (prompt, [])
        processed = checked_prompt(
            self.front.processor.process,
            prompt,
            self.max_model_len,
            self.scheduler.encoder_cache.capacity,
            self.scheduler.encoder_compute_budget,  # the one budget: what each step may encode
        )
        found = self.handles.embeddings(processed, handles) | supply_embeds(processed, embeds)
        self.start_store_lookup(processed, found)
        self.handles.register_named(prompt, named, processed)  # later prompts may name them
        return processed

    def process_all(self, prompts: Sequence[PromptInput], threads: int) -> list[ProcessedPrompt]:
        """``process`` each prompt, up to ``threads`` at a time (the offline API prepares a
        batch while the model is idle: one thread would leave the other cores idle). Results
        are in the prompts' order; the first failure in that order is raised once every
        prompt is done. A prompt naming a media handle starts after every prompt before it is
        done and finishes before any after it starts: it may name an image one of them
        registers (an image sent with a ``uuid``), and may register one itself."""
        if threads <= 1 or len(prompts) <= 1:
            return [self.process(p) for p in prompts]
        futures: list[Future[ProcessedPrompt]] = []
        with ThreadPoolExecutor(threads, thread_name_prefix="mmserve-intake") as pool:
            for prompt in prompts:
                names_handle = any(map(is_handle, [*prompt.images, *prompt.videos]))
                if names_handle:
                    wait(futures)
                futures.append(pool.submit(self.process, prompt))
                if names_handle:
                    wait(futures[-1:])
        return [future.result() for future in futures]

    def admit_encode(self, prompt: PromptInput) -> tuple[ProcessedPrompt, list[HandleRecord]]:
        """An encode-ahead prompt (its images and videos: no handles, no image_embeds)
        prepared and ``process``ed as any prompt is, with the records its handles will name
        (registered by ``LLMEngine`` once the embeddings exist): the images', then the videos'
        (``in_content_order`` puts them in the content's order). Thread-safe and blocking, as
        ``process``."""
        media = prompt.media
        if not media or any(is_handle(m) or isinstance(m, ImageEmbeds) for m in media):
            raise ValueError(
                "encode takes one or more images or videos (image_url or video_url parts with a"
                " URL, a data URL or a file), no media handles, uuids without data or"
                " image_embeds (encoded already: send them with the chat)"
            )
        ready = self.handles.prepared(prompt)
        processed = self.process(ready, name_uuids=False)  # registered once encoded
        records = [self.handles.record(ready, i) for i in range(len(ready.images))]
        records += [self.handles.video_record(ready, i) for i in range(len(ready.videos))]
        return processed, records

    def start_store_lookup(
        self, processed: ProcessedPrompt, found: dict[str, Future] | None = None
    ) -> None:
        """Ask the encoder store for the prompt's items (their keys final, salted) but those
        ``found`` already (media handles' embeddings, added as resolved lookups); a lookup left
        ``None`` means no store, no items, or every item in this engine's cache."""
        found = found or {}
        if self.store is not None and processed.mm_items:
            cached = self.scheduler.encoder_cache.contains  # a hint: read-only dict lookup
            skip = (lambda key: key in found or cached(key)) if found else cached
            processed.store_lookup = self.store.lookup(processed.mm_items, skip)
        if found:
            lookup = processed.store_lookup
            if lookup is None:
                metrics = self.store.metrics if self.store is not None else StoreMetrics()
                processed.store_lookup = StoreLookup(found, metrics)
            else:
                lookup.futures.update(found)

    @property
    def store_timeout_s(self) -> float:
        store = self.config.encoder_store
        return 0.0 if store is None else store.timeout_ms / 1000

    def wait_for_store(self, prompts: Sequence[ProcessedPrompt]) -> None:
        """Wait, at most the store deadline in all, for these prompts' store lookups (the
        offline path; the server awaits them in ``Admission``). Never on the engine thread."""
        deadline = time.monotonic() + self.store_timeout_s
        for processed in prompts:
            if processed.store_lookup is not None:
                processed.store_lookup.wait(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def take_store_hits(processed: ProcessedPrompt) -> list[MultiModalItem]:
        """The prompt's items with the lookups resolved by now attached: hits (loads) and
        waits for another replica's encode (``awaited``); one still pending is a miss
        (encoded). ``processed`` keeps no tensor: a caller may hold it for as long as the
        request runs (``LLM.generate`` does), the request drops them sooner."""
        lookup, processed.store_lookup = processed.store_lookup, None
        hits, waits = ({}, {}) if lookup is None else lookup.results()
        if not hits and not waits:
            return processed.mm_items
        return [
            dataclasses.replace(item, stored=hits.get(item.key), awaited=waits.get(item.key))
            for item in processed.mm_items
        ]

    # ---- ProcessedPrompt -> Request(s) ---------------------------------------------------
    def add_processed(
        self,
        processed: ProcessedPrompt,
        params: SamplingParams,
        request_id: str | None = None,
        prompt_text: str | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queue one processed prompt; ``params.n > 1`` fans out ``n`` child requests whose
        outputs come back merged under ``request_id`` (see ``engine.fanout``). ``cache_salt``
        defaults to the one the prompt was admitted with; an unset ``max_tokens`` is the
        room left in the context, at most the generation config's ``max_new_tokens``."""
        params.check_token_ids(self.vocab_size)
        if cache_salt is None:
            cache_salt = processed.cache_salt  # the salt admission scoped the images with
        max_num_seqs = self.config.scheduler.max_num_seqs
        if params.n > max_num_seqs:
            raise ValueError(f"n must be <= max_num_seqs ({max_num_seqs}), got {params.n}")
        if params.structured_outputs is not None:  # the server compiles it off the loop first
            self.grammar.compile(params.structured_outputs)
        req_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if params.max_tokens is None:
            cap = self.front.generation_defaults.get("max_tokens")
            room = default_max_tokens(self.max_model_len, len(processed.prompt_token_ids), cap)
            params = dataclasses.replace(params, max_tokens=room)
        if req_id in self.fanout.parents or (params.n > 1 and req_id in self.scheduler.requests):
            raise ValueError(f"request id {req_id!r} is already in use")
        items = self.take_store_hits(processed)
        if params.n == 1:
            self._add_request(req_id, processed, items, params, prompt_text, cache_salt)
        else:
            ids = self.fanout.add(req_id, params.n, prompt_text)
            leader = None
            prefix_caching = self.config.cache.enable_prefix_caching
            for cid, child in zip(ids, child_params(params), strict=True):
                request = self._add_request(cid, processed, items, child, None, cache_salt, leader)
                if prefix_caching and leader is None:
                    leader = request
        self.num_prompt_tokens += len(processed.prompt_token_ids)
        return req_id

    def _add_request(
        self,
        req_id: str,
        processed: ProcessedPrompt,
        items: list[MultiModalItem],
        params: SamplingParams,
        prompt_text: str | None,
        cache_salt: str | None,
        leader: Request | None = None,
    ) -> Request:
        request = Request(
            req_id,
            processed.prompt_token_ids,
            params,
            items,
            eos_token_ids=self.config.model.eos_token_ids,
            max_model_len=self.max_model_len,
            cache_salt=cache_salt,
            prefill_leader=leader,
        )
        self.scheduler.add_request(request)
        self.outputs.add(req_id, prompt_text)
        return request
