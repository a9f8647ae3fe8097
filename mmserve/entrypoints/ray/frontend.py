"""``FrontendEngine``: the parts of an ``LLMEngine`` the ingress needs, without the model."""

from __future__ import annotations

from dataclasses import dataclass

from mmserve.engine.admission.grammar import GrammarCompiler
from mmserve.engine.admission.prompt_limits import checked_prompt
from mmserve.engine.setup.loading import create_engine_config
from mmserve.engine.setup.model_front import ModelFront
from mmserve.engine_args import EngineArgs
from mmserve.inputs import ProcessedPrompt, PromptInput
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ReplicaFacts:
    """What only a loaded engine knows, asked of one replica when the ingress starts."""

    vocab_size: int
    encoder_cache_capacity: int
    encoder_budget: int


class FrontendEngine:
    """Tokenizer, chat template, generation defaults, image processor and grammar compiler of
    the served model (what ``OpenAIServing`` reads from an ``LLMEngine``), and the ingress'
    ``Admission`` (as the engine's ``RequestIntake`` is), so the ingress admits requests
    exactly as a single server does: same templates, same item keys, same checks. It runs
    nothing: ``get_metrics`` is empty and there is no step loop."""

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

    def process(self, prompt: PromptInput) -> ProcessedPrompt:
        """``RequestIntake.process`` without the store lookups (the replica starts those):
        the same processor and the same refusals."""
        return checked_prompt(
            self.processor.process,
            prompt,
            self.max_model_len,
            self.encoder_cache_capacity,
            self.encoder_budget,
        )

    def default_sampling_params(self) -> SamplingParams:
        return self.front.default_sampling_params()

    def get_metrics(self) -> dict[str, float]:
        return {}

    store_timeout_s = 0.0  # no encoder store here: the replicas look their items up

    def close(self) -> None:
        """Nothing to release (``AsyncLLMEngine.shutdown`` closes its engine)."""
