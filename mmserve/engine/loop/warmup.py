"""The warm-up a server runs before it reports healthy: one synthetic image request through the
whole engine path (processor, vision encoder, LM prefill and decode, sampler, detokenizer) and
one grammar compile, so the first user request pays no first-call costs (lazy imports, oneDNN
primitives, OpenMP thread start, xgrammar's tokenizer tables)."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from mmserve.engine.admission.grammar import GrammarCompiler, StructuredOutputsUnavailable
from mmserve.engine.admission.intake import RequestIntake
from mmserve.engine.outputs import RequestOutput
from mmserve.engine.setup.chat_template import ChatTemplate
from mmserve.inputs import PromptInput
from mmserve.multimodal.processor import InputProcessor
from mmserve.sampling_params import SamplingParams
from mmserve.structured_outputs import StructuredOutputsParams

logger = logging.getLogger(__name__)

# A large photo-like image first (the encoder's largest shapes on dynamic-resolution models),
# then smaller ones for engines whose limits refuse it.
WARMUP_IMAGE_SIZES = ((1280, 720), (448, 448), (224, 224))
WARMUP_TEXT = "Describe the image."
WARMUP_OUTPUT_TOKENS = 2  # one prefill and one decode step


def warmup_image(size: tuple[int, int] = WARMUP_IMAGE_SIZES[0]) -> Image.Image:
    """Deterministic noise (a flat image would not exercise the decoder the same way)."""
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def warmup_image_bytes() -> bytes:
    """``warmup_image()`` as JPEG, for the media worker processes (decode included)."""
    buf = io.BytesIO()
    warmup_image().save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class WarmupEngine(Protocol):
    """What the warm-up uses of an ``LLMEngine``."""

    chat_template: ChatTemplate
    processor: InputProcessor
    grammar: GrammarCompiler
    intake: RequestIntake
    runner: Any  # its encoder's ``num_images_encoded`` is read

    def step(self) -> list[RequestOutput]: ...


@dataclass(frozen=True)
class WarmupReport:
    """What the warm-up ran (read off its throwaway loop parts before they are dropped)."""

    images_encoded: int
    prompt_tokens: int
    output_tokens: int


def run_warmup_request(engine: WarmupEngine) -> WarmupReport:
    """One greedy request with the largest warm-up image the engine admits (text only when it
    admits none), stepped to its end, then a ``json_object`` grammar compile. A failure is a
    RuntimeError: a server whose warm-up fails would fail its users' requests too."""
    processed = None
    placeholder = engine.chat_template.image_placeholder
    if placeholder is not None and engine.processor.max_images > 0:
        for size in WARMUP_IMAGE_SIZES:
            try:
                prompt = PromptInput(f"{placeholder}\n{WARMUP_TEXT}", [warmup_image(size)])
                processed = engine.intake.process(prompt)
                break
            except ValueError as exc:  # larger than this engine's limits: try a smaller one
                logger.debug("warm-up image %s refused: %s", size, exc)
    if processed is None:
        processed = engine.intake.process(PromptInput(WARMUP_TEXT))
    params = SamplingParams(temperature=0, max_tokens=WARMUP_OUTPUT_TOKENS, ignore_eos=True)
    req_id = engine.intake.add_processed(processed, params)
    finished = None
    while finished is None:
        for out in engine.step():
            if out.request_id == req_id and out.finished:
                finished = out
    if finished.error is not None:
        raise RuntimeError(f"the warm-up request failed: {finished.error}")
    try:
        engine.grammar.compile(StructuredOutputsParams(json_object=True))
    except StructuredOutputsUnavailable as exc:
        logger.info("structured outputs are off: %s", exc)
    return WarmupReport(
        images_encoded=int(engine.runner.encoder.num_images_encoded),
        prompt_tokens=len(processed.prompt_token_ids),
        output_tokens=len(finished.outputs[0].token_ids),
    )
