"""``ModelFront``: what admission reads of a served model, built by one constructor that both
admission paths (the engine's intake and the Ray ingress) call, so they cannot drift."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from mmserve.config import EngineConfig
from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.engine.setup.generation_defaults import build_sampling_params, describe_defaults
from mmserve.engine.setup.loading import load_image_processor, load_tokenizer
from mmserve.multimodal.media.policy import MediaFetchPolicy
from mmserve.multimodal.processor import InputProcessor
from mmserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFront:
    """The served model's tokenizer, chat template, generation defaults and input processor
    (with the per-prompt image and video limits of the engine config)."""

    tokenizer: Any
    chat_template: ChatTemplate
    generation_defaults: dict[str, Any]
    processor: InputProcessor

    @classmethod
    def load(cls, config: EngineConfig, media_policy: MediaFetchPolicy) -> ModelFront:
        mc, sc = config.model, config.scheduler
        tokenizer = load_tokenizer(mc.path)
        template = ChatTemplate.of(
            mc.chat_template, mc.chat_template_source, getattr(mc.hf_config, "model_type", None)
        )
        logger.info(
            "chat template: %s (content format %s)", template.source, template.content_format
        )
        logger.info(describe_defaults(mc.generation_defaults, mc.path.name))
        processor = InputProcessor(
            mc,
            tokenizer,
            load_image_processor(mc.path, mc.processor_kwargs),
            sc.max_images_per_prompt,
            media_policy,
            functools.partial(load_image_processor, mc.path),
            sc.max_videos_per_prompt,
        )
        return cls(tokenizer, template, dict(mc.generation_defaults), processor)

    def default_sampling_params(self) -> SamplingParams:
        """The generation config's defaults (``max_tokens`` unset: sized per prompt)."""
        values = {k: v for k, v in self.generation_defaults.items() if k != "max_tokens"}
        return build_sampling_params(values)
