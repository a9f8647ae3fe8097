"""Encode-ahead in the server's engine loop keeps the per-step encoder budget: the images of one
``/v1/mm/encode`` are encoded a budget's worth at a time, with engine steps in between, so a
request that is decoding meanwhile is never held up for the whole batch of images."""

from __future__ import annotations

import asyncio

import pytest

from mmserve import SamplingParams
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.entrypoints.chat_utils import chat_to_prompt
from mmserve.inputs import PromptInput
from tests.support.images import make_image

IMAGES = 3


@pytest.fixture
def engine_and_log(monkeypatch: pytest.MonkeyPatch):
    llm_engine = LLMEngine.from_args("tiny-llava", limit_mm_per_prompt={"image": IMAGES})
    item = llm_engine.intake.process(PromptInput("USER: <image>\nHi", [make_image(0)]))
    llm_engine.encoder_budget = item.mm_items[0].length  # one image per step
    log: list[tuple[str, int]] = []
    real_step, real_encode = llm_engine.step, llm_engine.encode_items

    def step():
        log.append(("step", 0))
        return real_step()

    def encode_items(items):
        log.append(("encode", sum(i.length for i in items)))
        return real_encode(items)

    monkeypatch.setattr(llm_engine, "step", step)
    monkeypatch.setattr(llm_engine, "encode_items", encode_items)
    return AsyncLLMEngine(llm_engine), llm_engine.encoder_budget, log


def test_an_encode_of_several_images_runs_one_budget_per_step(engine_and_log) -> None:
    engine, budget, log = engine_and_log
    parts = [{"type": "image", "image": make_image(10 + i)} for i in range(IMAGES)]
    encode_prompt = chat_to_prompt(
        engine.tokenizer, [{"role": "user", "content": parts}], None, engine.chat_template
    )
    long_answer = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    async def decode_while_encoding():
        stream = engine.generate(PromptInput("USER: Hello ASSISTANT:"), params=long_answer)
        first = await anext(stream)  # decoding has started
        records = await engine.encode(encode_prompt)
        last = first
        async for out in stream:
            last = out
        return records, last

    try:
        records, last = asyncio.run(decode_while_encoding())
    finally:
        engine.shutdown()
    assert len(records) == IMAGES and last.outputs[0].finish_reason == "length"
    encodes = [i for i, (kind, _) in enumerate(log) if kind == "encode"]
    assert len(encodes) == IMAGES and all(log[i][1] <= budget for i in encodes)
    between = [kind for kind, _ in log[encodes[0] : encodes[-1]]]
    assert between.count("step") >= IMAGES - 1  # the decoding request stepped in between


def _items(lengths: list[int]) -> list:
    from mmserve.inputs import MultiModalItem

    return [
        MultiModalItem(hash=f"h{i}", offset=0, length=n, data={}) for i, n in enumerate(lengths)
    ]


def test_the_queue_splits_at_the_budget_fails_a_job_alone_and_skips_cancelled_ones() -> None:
    import concurrent.futures

    from mmserve.engine.errors import EngineStepError
    from mmserve.engine.front.encode_queue import EncodeQueue, split_at_budget

    items = _items([3, 4, 2, 9])
    assert [[i.length for i in part] for part in split_at_budget(items, 7)] == [[3, 4], [2, 9]]
    assert [len(part) for part in split_at_budget(items[3:], 5)] == [1, 0]  # one at least
    queue, calls = EncodeQueue(), []

    def encode(chunk):
        calls.append([i.hash for i in chunk])
        if chunk[0].hash == "h9":
            raise RuntimeError("boom")
        return len(chunk)

    failing, cancelled, ok = (concurrent.futures.Future() for _ in range(3))
    cancelled.cancel()
    queue.add(_items([1] * 10)[9:], failing)  # h9 raises
    queue.add(items, cancelled)
    queue.add(items, ok)
    while queue:
        queue.run_once(encode, 7)
    assert isinstance(failing.exception(), EngineStepError) and ok.result() == 4
    assert calls == [["h9"], ["h0", "h1"], ["h2"], ["h3"]]
