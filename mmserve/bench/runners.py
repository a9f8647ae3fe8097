"""Engines under test, behind one small interface: run one chat turn, report what it cost."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from mmserve import LLM, SamplingParams
from mmserve.entrypoints.chat_utils import parse_chat_messages, render_chat


@dataclass
class TurnResult:
    ttft_s: float
    encoder_s: float
    images_encoded: int
    prompt_tokens: int
    cached_tokens: int
    answer: str


class MmserveRunner:
    """mmserve with its caches on or off (off: no prefix cache, per-request encoder cache)."""

    def __init__(self, model: str, caches: bool, **engine_args: Any) -> None:
        self.name = "mmserve" if caches else "mmserve-nocache"
        self.llm = LLM(
            model, enable_prefix_caching=caches, enable_encoder_cache=caches, **engine_args
        )
        self.engine = self.llm.engine

    def chat_turn(self, messages: list[dict], answer_tokens: int) -> TurnResult:
        before = self.engine.get_metrics()
        start = time.monotonic()
        conv, images, uuids = parse_chat_messages(messages)
        prompt = render_chat(self.engine.tokenizer, conv)
        processed = self.engine.process_inputs(prompt, images, None)
        params = SamplingParams(temperature=0, max_tokens=answer_tokens, ignore_eos=True)
        req_id = self.engine.add_processed(processed, params)
        final = None
        while final is None:
            for out in self.engine.step():
                if out.request_id == req_id and out.finished:
                    final = out
        after = self.engine.get_metrics()
        return TurnResult(
            ttft_s=final.metrics["first_token_time"] - start,
            encoder_s=after["encoder_seconds"] - before["encoder_seconds"],
            images_encoded=after["encoder_images_encoded"] - before["encoder_images_encoded"],
            prompt_tokens=len(final.prompt_token_ids),
            cached_tokens=final.num_cached_tokens,
            answer=final.outputs[0].text,
        )


class TransformersRunner:
    """transformers ``generate`` with its own processor: the no-cache reference."""

    name = "transformers"

    def __init__(self, model: str, **_: Any) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from mmserve.models.tiny import resolve_model_path

        path = resolve_model_path(model)
        self.processor = AutoProcessor.from_pretrained(path)
        self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        self._encoder_s = 0.0
        self._images = 0
        vision = self.model.model.vision_tower if hasattr(self.model, "model") else None
        vision = getattr(self.model.model, "visual", vision)
        vision.register_forward_pre_hook(self._start)
        vision.register_forward_hook(self._stop)

    def _start(self, module, args) -> None:
        self._t0 = time.perf_counter()

    def _stop(self, module, args, output) -> None:
        self._encoder_s += time.perf_counter() - self._t0

    def chat_turn(self, messages: list[dict], answer_tokens: int) -> TurnResult:
        start = time.monotonic()
        conv, images, _ = parse_chat_messages(messages)
        from mmserve.multimodal.media import load_image

        pil = [load_image(src) for src in images]
        prompt = render_chat(self.processor.tokenizer, conv)
        inputs = self.processor(text=prompt, images=pil or None, return_tensors="pt")
        self._encoder_s = 0.0
        with torch.inference_mode():
            self.model.generate(**inputs, max_new_tokens=1, do_sample=False)
            ttft = time.monotonic() - start
            encoder_s = self._encoder_s
            out = self.model.generate(
                **inputs, max_new_tokens=answer_tokens, min_new_tokens=answer_tokens,
                do_sample=False,
            )
        n = inputs["input_ids"].shape[1]
        answer = self.processor.tokenizer.decode(out[0, n:], skip_special_tokens=True)
        return TurnResult(ttft, encoder_s, len(pil), n, 0, answer)


def make_runner(kind: str, model: str, **engine_args: Any):
    if kind == "mmserve":
        return MmserveRunner(model, caches=True, **engine_args)
    if kind == "mmserve-nocache":
        return MmserveRunner(model, caches=False, **engine_args)
    if kind == "transformers":
        return TransformersRunner(model)
    raise ValueError(f"unknown engine {kind!r}")
