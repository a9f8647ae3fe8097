"""The server's warm-up: one synthetic image request on throwaway loop parts of every family, and
the media workers and the JSON guard's helper started, before the server accepts a connection;
nothing of it shows in the metrics, the caches, the encoder store or later answers."""

from __future__ import annotations

import logging
import multiprocessing
import sys
from pathlib import Path

import httpx
import pytest

from mmserve import SamplingParams
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput
from mmserve.models.tiny import PRESET_NAMES
from tests.support.images import make_image
from tests.support.server import image_messages

FAMILIES = sorted(name for name in PRESET_NAMES if not name.endswith("-small"))
PROMPTS = {
    "tiny-llava": "USER: <image>\nWhat is in the picture? ASSISTANT:",
    "tiny-qwen2-vl": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?"
    "<|im_end|>\n<|im_start|>assistant\n",
}


def _answers(engine: LLMEngine, prompt: str) -> list[list[int]]:
    """Greedy and seeded-sampled answers to ``prompt`` with one image."""
    outs = []
    for params in (
        SamplingParams(temperature=0, max_tokens=8),
        SamplingParams(temperature=1.0, max_tokens=8),  # the runner's seed sequence
    ):
        processed = engine.intake.process(PromptInput(prompt, [make_image(3)]))
        req_id = engine.intake.add_processed(processed, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == req_id and out.finished:
                    outs.append(out.outputs[0].token_ids)
    return outs


@pytest.mark.parametrize("model", FAMILIES)
def test_warm_up_encodes_an_image_and_leaves_no_trace(model: str) -> None:
    engine = LLMEngine.from_args(model)
    fresh = engine.get_metrics()
    report = engine.warm_up()
    assert report.images_encoded == 1 and report.output_tokens == 2
    assert report.prompt_tokens > 20  # the image's embeddings are in the prompt
    assert engine.get_metrics() == fresh
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.encoder_cache.num_cached_embeddings == 0


@pytest.mark.parametrize("model", sorted(PROMPTS))
def test_answers_after_warm_up_are_those_of_a_cold_engine(model: str) -> None:
    cold = _answers(LLMEngine.from_args(model), PROMPTS[model])
    warm_engine = LLMEngine.from_args(model)
    warm_engine.warm_up()
    assert _answers(warm_engine, PROMPTS[model]) == cold


def test_warm_up_writes_nothing_to_the_encoder_store(tmp_path: Path) -> None:
    store = tmp_path / "store"

    def entries() -> list[Path]:
        return [p for p in store.rglob("*") if p.is_file() and not p.name.startswith(".")]

    engine = LLMEngine.from_args("tiny-llava", encoder_store_dir=str(store))
    engine.warm_up()
    engine.close()  # flushes the write-behind queue
    assert engine.get_metrics()["encoder_store_writes"] == 0 and not entries()
    engine = LLMEngine.from_args("tiny-llava", encoder_store_dir=str(store))
    _answers(engine, PROMPTS["tiny-llava"])
    engine.close()
    assert entries()  # a real request's encode is stored: the check above could see one


def test_an_engine_refusing_the_large_image_warms_up_with_a_smaller_one_or_text() -> None:
    short = LLMEngine.from_args("tiny-qwen2-vl", max_model_len=128)
    report = short.warm_up()
    assert report.images_encoded == 1 and report.prompt_tokens < 128
    no_image_fits = LLMEngine.from_args("tiny-llava", max_model_len=64)
    assert no_image_fits.warm_up().images_encoded == 0


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.parametrize("warm", [True, False])
def test_the_server_is_warm_before_it_accepts_a_connection(
    warm: bool, caplog: pytest.LogCaptureFixture, serve_model
) -> None:
    """With the warm-up, the media worker and the JSON guard's helper processes exist before
    the first request, and the log says what the warm-up took; --skip-server-warmup leaves
    them to the first image."""
    before = _children()
    flags = ("--media-workers", "1") if warm else ("--media-workers", "1", "--skip-server-warmup")
    with caplog.at_level(logging.INFO), serve_model("tiny-llava", *flags) as server:
        started = _children() - before
        body = {"model": "tiny-llava", "messages": image_messages(1), "max_tokens": 2}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    log = caplog.text
    if warm:
        assert len(started) == 2  # one media worker, the guard's helper
        assert "warm-up took" in log and "process(es) warm in" in log
    else:
        assert not started and "warm-up took" not in log


def test_warm_up_without_xgrammar_skips_the_grammar_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """xgrammar is the ``structured`` extra: a server without it still warms up and serves."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` fails as if absent
    engine = LLMEngine.from_args("tiny-llava")
    with caplog.at_level(logging.INFO):
        report = engine.warm_up()
    assert report.images_encoded == 1 and not engine.has_unfinished_requests()
    assert "mmserve[structured]" in caplog.text
