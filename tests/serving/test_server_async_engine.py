"""AsyncLLMEngine without HTTP: failures, overload, cancellation, shutdown, idle sleeping, and
the generic Prometheus export of the engine's metrics snapshot."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from mmserve.engine.errors import EngineOverloadedError, EngineShutdownError, EngineStepError
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.metrics.prometheus import ServerMetrics
from mmserve.engine.outputs import RequestOutput
from mmserve.entrypoints.openai.http.streaming import DeltaTracker
from mmserve.inputs import PromptInput
from mmserve.sampling_params import SamplingParams

PROMPT = "USER: <image>\nWhat is this? ASSISTANT:"
LONG = SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=4)


def image(seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def llm_engine() -> LLMEngine:
    return LLMEngine.from_args("tiny-llava")


@pytest.fixture
def engine(llm_engine: LLMEngine) -> Iterator[AsyncLLMEngine]:
    eng = AsyncLLMEngine(llm_engine)
    yield eng
    eng.shutdown()
    assert not llm_engine.has_unfinished_requests()


async def collect(gen: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in gen]


def wait_released(engine: AsyncLLMEngine, timeout: float = 5.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = engine.get_metrics()
        if m["kv_blocks_used"] == 0 and m["encoder_cache_references"] == 0:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.01)


def test_step_error_fails_requests_and_loop_survives(
    engine: AsyncLLMEngine, llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step, calls = llm_engine.step, []

    def flaky_step() -> list[RequestOutput]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real_step()

    monkeypatch.setattr(llm_engine, "step", flaky_step)
    with pytest.raises(EngineStepError, match="boom"):
        asyncio.run(collect(engine.generate(PromptInput(PROMPT, [image()]), params=SHORT)))
    wait_released(engine)
    outs = asyncio.run(collect(engine.generate(PromptInput(PROMPT, [image()]), params=SHORT)))
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 4
    engine.check_health()


def test_scheduler_stall_fails_requests_instead_of_hanging(
    llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmserve.core.outputs import SchedulerOutput

    # a scheduler that never schedules anything
    monkeypatch.setattr(llm_engine.scheduler, "schedule", lambda only=None: SchedulerOutput())
    monkeypatch.setattr(llm_engine.progress, "limit", 50)
    engine = AsyncLLMEngine(llm_engine)
    try:
        with pytest.raises(EngineStepError, match="no progress"):
            asyncio.run(
                asyncio.wait_for(collect(engine.generate(PromptInput("x"), params=SHORT)), 10)
            )
        assert not llm_engine.has_unfinished_requests()
    finally:
        engine.shutdown()


def test_bad_input_is_a_value_error_and_not_queued(engine: AsyncLLMEngine) -> None:
    with pytest.raises(ValueError, match="placeholder"):
        asyncio.run(
            collect(engine.generate(PromptInput("no placeholder here", [image()]), params=SHORT))
        )
    assert engine.num_queued_requests == 0


def test_overload_rejects_beyond_max_queued(
    llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, real_step = threading.Event(), llm_engine.step

    def gated_step() -> list[RequestOutput]:
        gate.wait(10)
        return real_step()

    monkeypatch.setattr(llm_engine, "step", gated_step)
    engine = AsyncLLMEngine(llm_engine, max_queued_requests=1)

    async def main() -> None:
        first = asyncio.ensure_future(collect(engine.generate(PromptInput("hello"), params=SHORT)))
        for _ in range(500):
            if engine.num_queued_requests == 1:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(EngineOverloadedError):
            await anext(engine.generate(PromptInput("second"), params=SHORT))
        gate.set()
        outs = await asyncio.wait_for(first, 10)
        assert outs[-1].finished
        assert (await collect(engine.generate(PromptInput("third"), params=SHORT)))[-1].finished

    try:
        asyncio.run(main())
    finally:
        gate.set()
        engine.shutdown()


def test_cancel_and_aclose_abort_and_free(engine: AsyncLLMEngine) -> None:
    async def main() -> None:
        gen = engine.generate(PromptInput(PROMPT, [image(1)]), params=LONG)
        first = await anext(gen)
        assert not first.finished and engine.get_metrics()["kv_blocks_used"] > 0
        await gen.aclose()  # consumer stops early (client disconnect)

        task = asyncio.ensure_future(
            collect(engine.generate(PromptInput(PROMPT, [image(2)]), params=LONG))
        )
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    m = wait_released(engine)
    assert m["num_requests_running"] == 0 and m["num_requests_waiting"] == 0
    assert m["generation_tokens"] < 2 * LONG.max_tokens


def test_shutdown_fails_inflight_and_rejects_new(llm_engine: LLMEngine) -> None:
    engine = AsyncLLMEngine(llm_engine)

    async def main() -> None:
        gen = engine.generate(PromptInput(PROMPT, [image(3)]), params=LONG)
        await anext(gen)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineShutdownError):
            async for _ in gen:
                pass
        with pytest.raises(EngineShutdownError):
            await anext(engine.generate(PromptInput("late"), params=SHORT))

    asyncio.run(main())
    with pytest.raises(EngineShutdownError):
        engine.check_health()
    assert llm_engine.get_metrics()["kv_blocks_used"] == 0
    assert not llm_engine.has_unfinished_requests()


def test_idle_loop_sleeps(
    engine: AsyncLLMEngine, llm_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(collect(engine.generate(PromptInput("warm up"), params=SHORT)))
    polls: list[int] = []
    real = llm_engine.has_unfinished_requests

    def counting() -> bool:
        polls.append(1)
        return real()

    monkeypatch.setattr(llm_engine, "has_unfinished_requests", counting)
    time.sleep(0.3)
    assert len(polls) <= 2  # asleep on the condition, not spinning
    outs = asyncio.run(
        collect(engine.generate(PromptInput("wake up"), params=SHORT))
    )  # and it wakes up
    assert outs[-1].finished and polls


def test_snapshot_export_is_generic() -> None:
    snapshot = {
        "kv_blocks_used": 3,
        "prefix_cache_hits": 5,
        "brand_new_gauge": 1.5,
        "prefix_cache_queries": 9,
        "label": "not numeric",
        "http_requests": 1,
    }
    metrics = ServerMetrics(lambda: snapshot)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["mmserve_kv_blocks_used"].type == "gauge"
    assert families["mmserve_brand_new_gauge"].type == "gauge"
    assert families["mmserve_prefix_cache_hits"].type == "counter"
    assert families["mmserve_prefix_cache_hits"].samples[0].value == 5
    assert families["mmserve_prefix_cache_queries"].samples[0].name.endswith("_total")
    assert "mmserve_label" not in families
    assert "mmserve_time_to_first_token_seconds" in families  # server histograms too
    broken = ServerMetrics(lambda: 1 / 0)  # a failing snapshot never breaks a scrape
    assert b"mmserve_e2e_request_latency_seconds" in broken.render()


def test_delta_tracker_never_emits_text_a_stop_string_removes() -> None:
    tracker = DeltaTracker(["STOP"])
    assert tracker.delta("hello S", False) == "hell"  # "o S" could start "STOP"
    assert tracker.delta("hello ST", False) == "o"
    assert tracker.delta("hello ", True) == " "  # the engine cut the text at the stop string
    assert DeltaTracker([]).delta("ab\ufffd", False) == "ab"  # incomplete UTF-8 held back


def test_a_tenants_salt_scopes_text_prefix_blocks_on_the_server_path(engine) -> None:
    """Found by the Ray helper: the async path never passed cache_salt to the engine, so
    text-only prefix blocks were shared across tenants (only image keys carried the salt)."""
    text = "USER: " + "tell me a long story about a red fox " * 6 + "ASSISTANT:"

    async def cached(salt: str | None) -> int:
        outs = await collect(engine.generate(PromptInput(text, cache_salt=salt), SHORT))
        return outs[-1].num_cached_tokens

    async def run() -> tuple[int, int, int]:
        await cached("tenant-a")
        return await cached("tenant-b"), await cached("tenant-a"), await cached(None)

    other, same, none = asyncio.run(run())
    assert same > 0  # the same tenant hits its own blocks
    assert other == 0 and none == 0  # another tenant (or none) does not
