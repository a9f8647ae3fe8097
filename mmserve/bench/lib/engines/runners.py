"""Engines under test, behind one small interface: run one chat turn, report what it cost."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.engines.meter import Meter
from mmserve.bench.lib.engines.reference import QWEN_VL, HFReference
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.chat_utils import chat_to_prompt, parse_chat_messages, render_chat
from mmserve.models.tiny import resolve_model_path
from mmserve.multimodal.image.idefics3 import IDEFICS3_ARCHITECTURES

# Qwen2-VL at its released limit gives a 720p image 1196 embeddings: 8 turns would not fit the
# tiny presets' 8192 positions. Benchmarks cap it at 640 merged patches per image by default.
QWEN_BENCH_MAX_PIXELS = 28 * 28 * 640
SMOLVLM_BENCH_TILES = 2  # tiles a side at most (``smolvlm_size_cap``)


@dataclass
class TurnResult:
    """What one chat turn cost one engine."""

    ttft_s: float
    encoder_s: float
    images_encoded: int
    prompt_tokens: int
    cached_tokens: int
    answer: str
    token_ids: list[int] = field(default_factory=list)
    embeddings_computed: int = 0
    image_tokens: int = 0


def _config(model: str) -> dict[str, Any]:
    return json.loads((resolve_model_path(model) / "config.json").read_text())


def architecture(model: str) -> str:
    """The HF architecture name of a preset or checkpoint directory."""
    return (_config(model).get("architectures") or [""])[0]


def model_max_len(model: str) -> int:
    """The text model's position limit (what every engine is given as max_model_len)."""
    config = _config(model)
    return int(config.get("text_config", config)["max_position_embeddings"])


def processor_kwargs_for(model: str, max_pixels: int | None) -> dict[str, Any]:
    """Processor kwargs every engine of a comparison uses (Qwen2/2.5-VL: a pixel cap;
    SmolVLM: a tile cap)."""
    arch = architecture(model)
    if arch in QWEN_VL:
        return {"max_pixels": max_pixels or QWEN_BENCH_MAX_PIXELS}
    if arch in IDEFICS3_ARCHITECTURES:
        return smolvlm_size_cap(model)
    return {}


def smolvlm_size_cap(model: str) -> dict[str, Any]:
    """SmolVLM resizes every image so its longest edge is the processor's ``size`` (2,048
    pixels on the hub: a 448x448 image becomes 16 tiles of 512 plus the whole image, 1,140
    prompt tokens and about 50 s a request on 2 CPU cores). Benchmarks cap the edge at
    ``SMOLVLM_BENCH_TILES`` tiles (5 tiles: 4 and the whole image), as vLLM's SmolVLM examples
    pass ``size`` in ``mm_processor_kwargs``; a processor that asks for less is left as is."""
    config = json.loads((resolve_model_path(model) / "preprocessor_config.json").read_text())
    cap = SMOLVLM_BENCH_TILES * int(config["max_image_size"]["longest_edge"])
    if int(config["size"]["longest_edge"]) <= cap:
        return {}
    return {"size": {"longest_edge": cap}}


class MmserveRunner:
    """mmserve with its caches on or off (off: no prefix cache, per-request encoder cache)."""

    def __init__(self, model: str, caches: bool, **engine_args: Any) -> None:
        self.name = "mmserve" if caches else "mmserve-nocache"
        engine_args.update(enable_prefix_caching=caches, enable_encoder_cache=caches)
        self.llm = LLM(model, **engine_args)
        self.engine = self.llm.engine

    @classmethod
    def wrapping(cls, llm: LLM, name: str = "mmserve") -> MmserveRunner:
        """A runner over an engine already loaded (its caches as it was built with)."""
        runner = cls.__new__(cls)
        runner.name, runner.llm, runner.engine = name, llm, llm.engine
        return runner

    def chat_turn(self, messages: list[dict], answer_tokens: int) -> TurnResult:
        """Template + ingress (decode, hash, preprocess) + schedule until the request ends."""
        before = self.engine.get_metrics()
        start = time.monotonic()
        inp = chat_to_prompt(self.engine.tokenizer, messages)
        processed = self.engine.intake.process(inp)
        params = SamplingParams(temperature=0, max_tokens=answer_tokens, ignore_eos=True)
        req_id = self.engine.intake.add_processed(processed, params)
        final = None
        while final is None:
            for out in self.engine.step():
                if out.request_id == req_id and out.finished:
                    final = out
        after = self.engine.get_metrics()
        return TurnResult(
            ttft_s=final.metrics["first_token_time"] - start,
            encoder_s=after["encoder_seconds"] - before["encoder_seconds"],
            images_encoded=int(after["encoder_images_encoded"] - before["encoder_images_encoded"]),
            prompt_tokens=len(final.prompt_token_ids),
            cached_tokens=final.num_cached_tokens,
            answer=final.outputs[0].text,
            token_ids=list(final.outputs[0].token_ids),
            embeddings_computed=int(
                after["encoder_embeddings_computed"] - before["encoder_embeddings_computed"]
            ),
            image_tokens=sum(item.length for item in processed.mm_items),
        )


class TransformersRunner:
    """transformers ``generate`` over the whole conversation every turn: the no-cache reference.

    TTFT is taken from a streamer (first generated token), so each turn runs ``generate`` once.
    """

    name = "transformers"

    def __init__(
        self,
        model: str,
        processor_kwargs: dict[str, Any] | None = None,
        device: str = "cpu",
        dtype: Any = None,
        **_: Any,
    ) -> None:
        self.ref = HFReference(model, processor_kwargs, device, dtype or torch.float32)
        self.image_token_id = self.ref.model.config.image_token_id

    @classmethod
    def wrapping(cls, ref: HFReference) -> TransformersRunner:
        """A runner over a reference already loaded."""
        runner = cls.__new__(cls)
        runner.ref, runner.image_token_id = ref, ref.model.config.image_token_id
        return runner

    def chat_turn(self, messages: list[dict], answer_tokens: int) -> TurnResult:
        from mmserve.multimodal.image.decode import load_image
        from mmserve.multimodal.media.fetch import MediaFetcher
        from mmserve.multimodal.media.policy import MediaFetchPolicy

        fetcher = MediaFetcher(MediaFetchPolicy(allowed_local_path=True))
        start = time.monotonic()
        conv, images, _, _ = parse_chat_messages(messages)
        pil = [load_image(src, fetcher) for src in images]
        prompt = render_chat(self.ref.tokenizer, conv)
        inputs = self.ref.inputs(prompt, pil)
        self.ref.encoder_seconds = 0.0
        ids, first = self.ref.generate(inputs, answer_tokens, time.monotonic)
        answer = str(self.ref.tokenizer.decode(ids, skip_special_tokens=True))
        n = int(inputs["input_ids"].shape[1])
        ttft = (first if first is not None else time.monotonic()) - start
        image_tokens = int((inputs["input_ids"] == self.image_token_id).sum())
        return TurnResult(
            ttft, self.ref.encoder_seconds, len(pil), n, 0, answer, ids, image_tokens, image_tokens
        )


BENCH_DEFAULTS = {"model": "tiny-llava-small"}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags of ``EngineArgs`` for a workload (its own ``--seed`` seeds the data).
    No ``--revision`` / ``--download-dir``: every engine of a comparison (transformers, vLLM
    too) reads a hub ID's default revision from huggingface_hub's cache."""
    group = parser.add_argument_group("engine (EngineArgs; workload modes override some)")
    exclude = ("seed", "revision", "download_dir")
    EngineArgs.add_cli_args(group, defaults=BENCH_DEFAULTS, exclude=exclude)


def make_runner(kind: str, model: str, **engine_args: Any) -> MmserveRunner | TransformersRunner:
    """``kind``: mmserve | mmserve-nocache | transformers (vLLM runs as a subprocess worker)."""
    if kind == "mmserve":
        return MmserveRunner(model, caches=True, **engine_args)
    if kind == "mmserve-nocache":
        return MmserveRunner(model, caches=False, **engine_args)
    if kind == "transformers":
        return TransformersRunner(model, **engine_args)
    raise ValueError(f"unknown engine {kind!r}")


def run_transformers(
    ref: HFReference, requests: list[dict], max_tokens: int, arrival: str
) -> dict[str, Any]:
    """transformers serves one request at a time: under ``all`` later requests queue."""
    meter = Meter()
    t0 = time.monotonic()
    outs, ttfts, prompt_tokens = [], [], 0
    for request in tqdm(requests, desc="transformers"):
        start = time.monotonic() if arrival == "sequential" else t0
        inputs = ref.inputs(request["prompt"], request["images"])
        ids, first = ref.generate(inputs, max_tokens, time.monotonic)
        outs.append(ids)
        ttfts.append((first or time.monotonic()) - start)
        prompt_tokens += int(inputs["input_ids"].shape[1])
    wall = time.monotonic() - t0
    return {
        "wall_s": wall,
        "meter": meter.stop(),
        "ttfts": ttfts,
        "outputs": outs,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": 0,
        "images_encoded": len(requests),
        "encoder_s": ref.encoder_seconds,
    }
