"""Turns a SchedulerOutput into one flat varlen forward pass and samples the next tokens."""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

from mmserve.core.outputs import ModelRunnerOutput, NewRequestData, SchedulerOutput
from mmserve.layers.attention import PagedKVCache
from mmserve.models.interface import DeepstackInputs, VisionLanguageModel
from mmserve.sampling_params import TokenLogprobs
from mmserve.worker.cuda_graphs import DecodeGraphs
from mmserve.worker.decode_rows import decode_rows
from mmserve.worker.encoder_runner import EncoderRunner
from mmserve.worker.flat_batch import FlatBatch, FlatBatchBuilder
from mmserve.worker.grammar_mask import GrammarMask, new_matcher
from mmserve.worker.logits_processors import TokenHistory
from mmserve.worker.request_state import RequestState
from mmserve.worker.sampler import compute_logprobs, sample

PROMPT_LOGPROBS_ROWS = 256  # prompt positions per logits matrix (bounds its memory)
logger = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, the paged KV cache and the per-request token/block state the worker needs.

    Per step: forget ended requests, drop evicted embeddings, encode the scheduled images, then run
    every scheduled token of every request in one forward pass.

    Image embeddings of the scheduled tokens are spliced into the input embeddings; a model with
    DeepStack layers gets the rest of those rows (its DeepStack features) as ``DeepstackInputs``.

    Models with ``uses_mrope`` get their ``mrope_positions(num_tokens, mm_items)`` computed
    once when the worker (re)sees a request; ``FlatBatchBuilder`` slices it for each step.

    With ``graphs``, a decode-only step (``decode_rows``) runs their fixed-shape forward
    (CUDA graphs); every other step, and every step once they raised, runs eagerly. Sampling
    is the same either way.
    """

    def __init__(
        self,
        model: VisionLanguageModel,
        kv_cache: PagedKVCache,
        device: torch.device,
        seed: int,
        attention_backend: str = "torch",
        eos_token_ids: frozenset[int] = frozenset(),
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.graphs = graphs
        self.kv_cache = kv_cache
        self.device = device
        self.encoder = EncoderRunner(model, device)
        self.states: dict[str, RequestState] = {}
        self._seeds = random.Random(seed)
        self._parked_generators: dict[str, torch.Generator] = {}
        self.uses_mrope = model.uses_mrope
        self.deepstack = model.deepstack_layers > 0
        self.batches = FlatBatchBuilder(
            self.encoder,
            device,
            kv_cache.block_size,
            attention_backend,
            model.uses_mrope,
            model.image_attention == "bidirectional",
        )
        self.eos_token_ids = eos_token_ids  # masked by min_tokens
        self.grammar = GrammarMask()
        # preempted requests' grammar matchers, kept like their generators (they have accepted
        # every output token so far, which the request brings back as prompt)
        self._parked_matchers: dict[str, Any] = {}

    def _add_request(self, new: NewRequestData) -> None:
        params = new.sampling_params
        generator = self._parked_generators.pop(new.req_id, None)
        if generator is None and not params.greedy:
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            generator = torch.Generator(device=self.device).manual_seed(seed)
        self.states[new.req_id] = RequestState(
            list(new.token_ids),
            new.mm_items,
            params,
            torch.tensor(new.block_ids, dtype=torch.long),
            new.num_computed_tokens,
            generator,
            self.model.mrope_positions(len(new.token_ids), new.mm_items)
            if self.uses_mrope
            else None,
            len(new.token_ids) if new.num_prompt_tokens is None else new.num_prompt_tokens,
            self._matcher(new),
        )

    def _matcher(self, new: NewRequestData) -> Any:
        parked = self._parked_matchers.pop(new.req_id, None)
        spec = new.sampling_params.structured_outputs
        if parked is not None or spec is None:
            return parked
        if spec.compiled is None:
            raise ValueError("structured_outputs must be compiled before the request runs")
        return new_matcher(spec.compiled)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step. If it raises, the worker is as before the step except that the ended,
        preempted and evicted state ``sched`` reports is gone (repeating that is harmless), so
        the scheduler can roll the step back and retry its requests."""
        for req_id in sched.finished_req_ids:
            self.states.pop(req_id, None)
            self._parked_generators.pop(req_id, None)
            self._parked_matchers.pop(req_id, None)
        for req_id in sched.preempted_req_ids:
            state = self.states.pop(req_id, None)
            if state is not None and state.generator is not None:
                self._parked_generators[req_id] = state.generator
            if state is not None and state.matcher is not None:
                self._parked_matchers[req_id] = state.matcher
        self.encoder.evict(sched.freed_encoder_keys)
        self.encoder.begin_step()
        undo = self._apply_request_changes(sched)
        try:
            if sched.is_empty:
                return ModelRunnerOutput()
            return self._run(sched)
        except BaseException:
            self.encoder.drop_step_encodes()
            undo()
            raise

    def _apply_request_changes(self, sched: SchedulerOutput):
        """Add the new requests and extend the cached ones; returns a function undoing it."""
        added: list[tuple[str, torch.Generator | None, Any]] = []
        previous: list[tuple[RequestState, torch.Tensor, int]] = []
        for new in sched.new_requests:
            parked = self._parked_generators.get(new.req_id)
            added.append((new.req_id, parked, self._parked_matchers.get(new.req_id)))
            self._add_request(new)
        for cached in sched.cached_requests:
            state = self.states[cached.req_id]
            previous.append((state, state.block_table, state.num_computed_tokens))
            if cached.new_block_ids:
                more = torch.tensor(cached.new_block_ids, dtype=torch.long)
                state.block_table = torch.cat((state.block_table, more))
            state.num_computed_tokens = cached.num_computed_tokens

        def undo() -> None:
            for state, table, num_computed in previous:
                state.block_table, state.num_computed_tokens = table, num_computed
            for req_id, parked, matcher in added:
                self.states.pop(req_id, None)
                if parked is not None:
                    self._parked_generators[req_id] = parked
                if matcher is not None:
                    self._parked_matchers[req_id] = matcher

        return undo

    def _run(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        seconds, images = self.encoder.encoder_seconds, self.encoder.num_images_encoded
        unloaded = self.encoder.load(
            [
                self.states[req_id].mm_items[idx]
                for req_id, indices in sched.scheduled_encoder_loads.items()
                for idx in indices
            ]
        )
        self.encoder.encode(
            [
                self.states[req_id].mm_items[idx]
                for req_id, indices in sched.scheduled_encoder_inputs.items()
                for idx in indices
            ]
            + unloaded
        )
        with torch.inference_mode():
            decoded = self._run_decode_graphs(sched)
            if decoded is not None:
                last_hidden, sample_req_ids = decoded
                hidden, prompt_rows = last_hidden, []
            else:
                batch = self.batches.build(sched, self.states)
                hidden = self._forward(batch)
                last_hidden, sample_req_ids = hidden[batch.sample_idx], batch.sample_req_ids
                prompt_rows = batch.prompt_rows
            # float32 logits whatever the model's dtype: grammar masks, logits processors,
            # argmax and logprobs all see them (vLLM samples from float32 too)
            logits = self.model.compute_logits(last_hidden).float()
            states = [self.states[r] for r in sample_req_ids]
            params = [s.params for s in states]
            matchers = [s.matcher for s in states]
            if any(m is not None for m in matchers):
                logits = self.grammar.apply(logits, matchers)
            histories = None
            if any(p.needs_logits_processing for p in params):
                histories = [TokenHistory(s.token_ids, s.num_prompt_tokens) for s in states]
            sampled = sample(
                logits, params, [s.generator for s in states], histories, self.eos_token_ids
            )
            prompt_logprobs = self._prompt_logprobs(hidden, prompt_rows)
        tokens = sampled.token_ids
        for req_id, n in sched.num_scheduled_tokens.items():
            self.states[req_id].num_computed_tokens += n
        for state, token in zip(states, tokens, strict=True):
            state.token_ids.append(token)
        if any(m is not None for m in matchers):
            self.grammar.advance(matchers, tokens)
        logprobs = (
            {}
            if not sampled.logprobs
            else {
                req_id: lp
                for req_id, lp in zip(sample_req_ids, sampled.logprobs, strict=True)
                if lp is not None
            }
        )
        return ModelRunnerOutput(
            sampled_token_ids=dict(zip(sample_req_ids, tokens, strict=True)),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            encoder_seconds=self.encoder.encoder_seconds - seconds,
            num_images_encoded=self.encoder.num_images_encoded - images,
            encoded_instead=frozenset(self.encoder.encoded_instead),
        )

    def _forward(self, batch: FlatBatch) -> torch.Tensor:
        """The eager forward of a flat batch: hidden states of every row."""
        embeds = self.model.embed(batch.token_ids)
        deepstack = None
        if batch.mm_src:
            rows = torch.cat(batch.mm_src).to(embeds.dtype)
            if self.deepstack:  # wide rows: main embedding, then the DeepStack features
                width = embeds.shape[1]
                deepstack = DeepstackInputs(batch.mm_dst, rows[:, width:])
                rows = rows[:, :width]
            embeds[batch.mm_dst] = rows
        return self.model(embeds, batch.positions, self.kv_cache, batch.meta, deepstack)

    def _run_decode_graphs(self, sched: SchedulerOutput) -> tuple[torch.Tensor, list[str]] | None:
        """A decode-only step's last hidden states and request ids from the graphs; None when
        the step runs eagerly. If the graphs raise, they are turned off (one warning) and the
        step runs eagerly: it rewrites the same KV slots, so nothing they wrote matters."""
        graphs = self.graphs
        if graphs is None or not graphs.enabled:
            return None
        rows = decode_rows(sched, self.states, graphs.config.max_batch, graphs.config.max_context)
        if rows is None:
            return None
        try:
            return graphs.run(rows), rows.req_ids
        except Exception as exc:  # a bug in the fixed-shape path costs speed, not the step
            graphs.enabled = False
            why = (str(exc).splitlines() or [""])[0][:200]
            logger.warning(
                "decode graphs: off, decode runs eagerly (%s: %s)", type(exc).__name__, why
            )
            return None

    def _prompt_logprobs(
        self, hidden: torch.Tensor, prompt_rows: list[tuple[str, int, int, int]]
    ) -> dict[str, tuple[int, list[TokenLogprobs]]]:
        """Raw log-softmax of the prompt positions' logits: row j predicts prompt token j + 1."""
        out: dict[str, tuple[int, list[TokenLogprobs]]] = {}
        for req_id, row, first, count in prompt_rows:
            state = self.states[req_id]
            num_top = state.params.prompt_logprobs or 0
            entries: list[TokenLogprobs] = []
            for lo in range(0, count, PROMPT_LOGPROBS_ROWS):
                hi = min(count, lo + PROMPT_LOGPROBS_ROWS)
                logits = self.model.compute_logits(hidden[row + lo : row + hi])
                targets = state.token_ids[first + lo + 1 : first + hi + 1]
                rows = logits.float().log_softmax(-1)
                entries += compute_logprobs(rows, targets, [num_top] * (hi - lo))
            out[req_id] = (first, entries)
        return out
