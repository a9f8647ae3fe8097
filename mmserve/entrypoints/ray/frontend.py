"""``FrontendEngine``: the parts of an ``LLMEngine`` the ingress needs, without the model."""

from __future__ import annotations

from dataclasses import dataclass

from mmserve.engine.admission.grammar import GrammarCompiler
from mmserve.engine.admission.handles import HandleBook, mark_by_handle
from mmserve.engine.admission.prompt_limits import checked_prompt
from mmserve.engine.setup.loading import create_engine_config, torch_dtype
from mmserve.engine.setup.model_front import ModelFront
from mmserve.engine_args import EngineArgs
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import MediaHandleError, is_handle
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.sampling_params import SamplingParams
from mmserve.store.factory import open_shared_store

NO_SHARED_STORE = (
    "media handles (mmserve://, /v1/mm/encode, image uuids without data) need the replicas'"
    " shared encoder store through the Ray ingress (--encoder-store-redis with"
    " --encoder-store-secret): without it a handle lives in the memory of the one replica that"
    " encoded it, which the ingress and the other replicas cannot read; send the image itself"
)


@dataclass(frozen=True)
class ReplicaFacts:
    """What only a loaded engine knows, asked of one replica when the ingress starts."""

    vocab_size: int
    encoder_cache_capacity: int
    encoder_budget: int
    store_fingerprint: str | None = None  # the encoder store's weights fingerprint, if any


class FrontendEngine:
    """Tokenizer, chat template, generation defaults, image processor and grammar compiler of
    the served model (what ``OpenAIServing`` reads from an ``LLMEngine``), and the ingress'
    ``Admission`` (as the engine's ``RequestIntake`` is), so the ingress admits requests
    exactly as a single server does: same templates, same item keys, same checks. It runs
    nothing: ``get_metrics`` is empty and there is no step loop.

    Media handles: with the replicas' Redis store, ``handles`` resolves them as an engine does
    (the records the replicas and ingresses wrote, read from Redis with the replicas' weights
    fingerprint; same tenant checks) and their items are marked ``by_handle``: the replica
    loads their embeddings (``HandleBook.embeddings``) and never encodes them. A chat's images
    sent with a ``uuid`` are registered there, as an engine registers them in its own. Without
    Redis, ``handles`` is None and a prompt naming one is ``MediaHandleError``
    ``media_handle_unsupported``."""

    def __init__(
        self, settings: EngineArgs, facts: ReplicaFacts, media_policy: MediaFetchPolicy
    ) -> None:
        self.config = create_engine_config(settings)
        mc = self.config.model
        self.front = ModelFront.load(self.config, media_policy)
        self.tokenizer, self.processor = self.front.tokenizer, self.front.processor
        self.chat_template = self.front.chat_template
        self.generation_defaults = self.front.generation_defaults
        self.vocab_size = facts.vocab_size
        self.grammar = GrammarCompiler(self.tokenizer, self.vocab_size, mc.eos_token_ids)
        self.max_model_len = mc.max_model_len
        self.encoder_cache_capacity = facts.encoder_cache_capacity
        self.encoder_budget = facts.encoder_budget
        self.handles: HandleBook | None = None
        store_config = self.config.encoder_store
        if store_config is not None and facts.store_fingerprint is not None:
            store = open_shared_store(
                store_config, facts.store_fingerprint, mc.dtype, torch_dtype(mc.dtype)
            )
            if store is not None:  # records only: nothing here holds an embedding
                timeout_s = store_config.timeout_ms / 1000
                self.handles = HandleBook(self.processor, store, lambda key: None, timeout_s)

    def process(self, prompt: PromptInput, *, name_uuids: bool = True) -> ProcessedPrompt:
        """``RequestIntake.process`` without the store lookups (the replica starts those, and
        loads the embeddings of handles): the same processor, the same refusals and, with the
        shared store, the same registration of images sent with a ``uuid`` (``name_uuids``;
        the replica registers encode-ahead's once encoded). A replica then asks for the image
        again until the embedding is in its cache or the store."""
        used: set[str] = set()
        named: list[int] = []
        if self.handles is not None:
            prompt, used = self.handles.resolve(prompt)  # blocking: records from Redis
            prompt, named = self.handles.named(prompt) if name_uuids else (prompt, [])
        elif any(map(is_handle, prompt.media)):
            raise MediaHandleError(NO_SHARED_STORE, "media_handle_unsupported")
        processed = checked_prompt(
            self.processor.process,
            prompt,
            self.max_model_len,
            self.encoder_cache_capacity,
            self.encoder_budget,
        )
        mark_by_handle(processed, used)  # as ``HandleBook.embeddings`` does on the replica
        if self.handles is not None:  # admitted: later chats may name them, through any ingress
            self.handles.register_named(prompt, named)  # lends nothing: replicas encode
        return processed

    def default_sampling_params(self) -> SamplingParams:
        return self.front.default_sampling_params()

    def get_metrics(self) -> dict[str, float]:
        return {}

    store_timeout_s = 0.0  # no encoder store lookups here: the replicas look their items up

    def close(self) -> None:
        """Close the records' store, if any (``AsyncLLMEngine.shutdown`` calls this)."""
        if self.handles is not None and self.handles.store is not None:
            self.handles.store.close()
