"""Issue 11: the engine never deadlocks, livelocks or crashes on encoder-cache scheduling, and a
failure takes down only the request that causes it (every scenario reproduced on ea3ac14)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.engine.errors import EngineStepError
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

GREEDY = SamplingParams(temperature=0, max_tokens=8)
LLAVA_3 = "USER: <image>\n<image>\n<image>\nWhat differs? ASSISTANT:"
LLAVA_5 = "USER: " + "<image>\n" * 5 + "Compare. ASSISTANT:"
QWEN_VISION = "<|vision_start|><|image_pad|><|vision_end|>"


def qwen_prompt(n: int) -> str:
    return f"<|im_start|>user\n{QWEN_VISION * n}Compare.<|im_end|>\n<|im_start|>assistant\n"


def bounded_generate(llm: LLM, prompts: list[dict], params=GREEDY, max_steps: int = 3000):
    """Step the engine directly so a livelock fails the test instead of hanging it."""
    engine = llm.engine
    ids = [
        engine.add_request(PromptInput(p["prompt"], p.get("images", [])), params) for p in prompts
    ]
    done: dict = {}
    for _ in range(max_steps):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if len(done) == len(ids):
            return [done[i] for i in ids]
    raise AssertionError(f"not finished after {max_steps} steps: {engine.get_metrics()}")


def plain_outputs(model: str, prompts: list[dict], params=GREEDY, **kwargs) -> list[list[int]]:
    """The same prompts on an engine with caches off and roomy budgets."""
    plain = LLM(model, enable_prefix_caching=False, enable_encoder_cache=False, **kwargs)
    return [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def abc():
    return make_image(0), make_image(1, (64, 64)), make_image(2, (120, 50))


# ---- 1. the same image twice in one prompt ---------------------------------------------------
def test_repeated_image_with_one_image_of_cache_space(reference, abc):
    a, b, _ = abc
    llm = LLM("tiny-llava", encoder_cache_size=256)
    (out,) = bounded_generate(llm, [{"prompt": LLAVA_3, "images": [a, b, a]}])
    assert out.outputs[0].token_ids == reference.greedy(LLAVA_3, [a, b, a], 8)
    assert out.outputs[0].finish_reason == "length"
    assert_no_leaks(llm)


def test_repeated_images_with_autotuned_budgets(reference, abc):
    a, b, c = abc
    llm = LLM("tiny-llava", enable_encoder_cache=False, max_num_batched_tokens=256)
    (out,) = bounded_generate(llm, [{"prompt": LLAVA_5, "images": [a, b, c, a, b]}])
    assert out.outputs[0].token_ids == reference.greedy(LLAVA_5, [a, b, c, a, b], 8)
    assert_no_leaks(llm)


def test_repeated_image_qwen2_vl():
    x, y = make_image(5, (252, 252)), make_image(6, (504, 364))
    prompt = {"prompt": qwen_prompt(3), "images": [x, y, x]}
    llm = LLM("tiny-qwen2-vl", encoder_cache_size=256)
    lengths = [
        item.length
        for item in llm.engine.intake.process(PromptInput(qwen_prompt(2), [x, y])).mm_items
    ]
    assert lengths == [81, 234]
    (out,) = bounded_generate(llm, [prompt])
    assert out.outputs[0].token_ids == plain_outputs("tiny-qwen2-vl", [prompt])[0]
    assert_no_leaks(llm)


# ---- 2. livelock: another request keeps being preempted --------------------------------------
def test_repeated_image_beside_a_request_that_keeps_being_preempted(abc):
    a, b, c = abc
    prompts = [
        {"prompt": LLAVA_3, "images": [a, b, a]},
        {"prompt": "USER: <image>\n<image>\nAnd these? ASSISTANT:", "images": [c, b]},
    ]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(
        "tiny-llava",
        encoder_cache_size=256,
        num_kv_blocks=60,
        max_model_len=960,
        max_num_batched_tokens=128,
    )
    outs = bounded_generate(llm, prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs("tiny-llava", prompts, params)
    assert llm.get_metrics()["num_preemptions"] > 0
    assert_no_leaks(llm)


# ---- 3. the server: a stuck request fails alone ----------------------------------------------
def test_async_engine_serves_repeated_image_and_bystander(abc):
    a, b, c = abc
    engine = AsyncLLMEngine(LLMEngine.from_args("tiny-llava", encoder_cache_size=256))

    async def both():
        async def run(prompt, images):
            return [o async for o in engine.generate(PromptInput(prompt, images), params=GREEDY)][
                -1
            ]

        return await asyncio.gather(
            run(LLAVA_3, [a, b, a]), run("USER: <image>\nWhat? ASSISTANT:", [c])
        )

    try:
        outs = asyncio.run(both())
    finally:
        engine.shutdown()
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "length"]


def test_a_request_that_cannot_progress_fails_alone(abc, monkeypatch):
    """A fault that makes one request unschedulable: the stall detector fails only it, and the
    request waiting behind it for cache space completes."""
    a, b, c = abc
    engine = LLMEngine.from_args("tiny-llava", encoder_cache_size=256)
    engine.progress.limit = 20
    stuck_id = engine.add_request(PromptInput(LLAVA_3, [a, b, a]), GREEDY, request_id="stuck")
    real_plan = engine.scheduler._plan

    def refuse_stuck(request, *args):
        plan = real_plan(request, *args)
        if request.req_id == stuck_id and request.num_computed_tokens > 200:
            plan.num_new_tokens = 0
        return plan

    monkeypatch.setattr(engine.scheduler, "_plan", refuse_stuck)
    engine.add_request(PromptInput("USER: <image>\nWhat? ASSISTANT:", [c]), GREEDY, "bystander")
    done = {}
    for _ in range(500):
        done.update({o.request_id: o for o in engine.step() if o.finished})
        if len(done) == 2:
            break
    assert done["stuck"].outputs[0].finish_reason == "error"
    assert "no progress" in done["stuck"].error and "stall_steps" in done["stuck"].error
    assert done["bystander"].outputs[0].finish_reason == "length"
    assert engine.get_metrics()["kv_blocks_used"] == 0


def test_async_engine_fails_only_the_stuck_request(abc, monkeypatch):
    a, b, c = abc
    llm_engine = LLMEngine.from_args("tiny-llava", encoder_cache_size=256, stall_steps=20)
    real_plan = llm_engine.scheduler._plan

    def refuse_stuck(request, *args):
        plan = real_plan(request, *args)
        if len(request.mm_items) == 3 and request.num_computed_tokens > 200:
            plan.num_new_tokens = 0
        return plan

    monkeypatch.setattr(llm_engine.scheduler, "_plan", refuse_stuck)
    engine = AsyncLLMEngine(llm_engine)

    async def both():
        async def run(prompt, images):
            return [o async for o in engine.generate(PromptInput(prompt, images), params=GREEDY)][
                -1
            ]

        return await asyncio.gather(
            run(LLAVA_3, [a, b, a]),
            run("USER: <image>\nWhat? ASSISTANT:", [c]),
            return_exceptions=True,
        )

    try:
        stuck, bystander = asyncio.run(both())
        engine.check_health()
    finally:
        engine.shutdown()
    assert isinstance(stuck, EngineStepError) and "no progress" in str(stuck)
    assert bystander.outputs[0].finish_reason == "length"


# ---- 4. preemption inside schedule() with the encoder cache off ------------------------------
def test_preemption_that_evicts_a_planned_hit_is_replanned():
    """``old`` plans a hit on A that only ``young`` holds, then must preempt ``young`` for a KV
    block; with the encoder cache off that release evicts A, so the plan must be recomputed (on
    ea3ac14 the stale hit was committed and ``schedule()`` raised KeyError half-applied)."""
    from mmserve.core.outputs import ModelRunnerOutput
    from tests.support.scheduler import assert_all_free, make_request, make_scheduler

    sched = make_scheduler(
        num_blocks=2, block_size=8, budget=8, encoder_budget=16, encoder_capacity=16
    )
    sched.encoder_cache.retain_unreferenced = False
    old = make_request("old", [8, ("A", 16), 8])
    young = make_request("young", [("A", 16), 8])
    sched.add_request(old)
    sched.update(sched.schedule(), ModelRunnerOutput())  # old: its text [0, 8)
    sched.add_request(young)
    sched.update(sched.schedule(only={"young"}), ModelRunnerOutput())  # young: A[0, 8)
    assert sched.encoder_cache.is_referenced_by(young.mm_items[0].key, "young")
    out = sched.schedule()  # old reaches A, needs a block, preempts young
    assert out.num_scheduled_tokens == {"old": 8}
    assert out.scheduled_encoder_inputs == {"old": [0]}  # A is encoded again, not a stale hit
    assert young in sched.waiting and out.preempted_req_ids == {"young"}
    assert sched.encoder_cache.referenced == {old.mm_items[0].key: {"old"}}
    sched.update(out, ModelRunnerOutput())
    sched.finish_requests(["old", "young"], old.status.FINISHED_ABORTED)
    assert_all_free(sched)


# ---- 5. a failure inside the vision encoder ---------------------------------------------------
def test_encoder_failure_is_retried_within_the_budget(reference, abc, caplog, monkeypatch):
    a, _, _ = abc
    llm = LLM("tiny-llava")
    model = llm.engine.model
    real, calls = model.encode_images, []

    def oom_once(pixels):
        calls.append(len(pixels))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("simulated: out of memory in the vision tower")
        return real(pixels)

    monkeypatch.setattr(model, "encode_images", oom_once)
    prompt = "USER: <image>\nWhat? ASSISTANT:"
    with caplog.at_level(logging.ERROR):
        (out,) = llm.generate({"prompt": prompt, "images": [a]}, GREEDY, use_tqdm=False)
    assert out.outputs[0].token_ids == reference.greedy(prompt, [a], 8)
    assert "missing at gather" not in caplog.text
    metrics = llm.get_metrics()
    assert metrics["encoder_cache_hits"] == 0  # the retry is an encode, not a phantom hit
    assert metrics["encoder_images_encoded"] == 1
    assert_no_leaks(llm)


# ---- 6. one failing request, not the batch ----------------------------------------------------
def test_a_poisoned_image_fails_only_its_request(reference, abc, monkeypatch):
    a, b, c = abc
    llm = LLM("tiny-llava")
    model = llm.engine.model
    real = model.encode_images
    poison = llm.engine.intake.process(PromptInput("<image>", [c])).mm_items[0].data

    def encode(pixels):
        if any(p is poison for p in pixels):
            raise ValueError("the vision tower rejects this image")
        return real(pixels)

    monkeypatch.setattr(model, "encode_images", encode)
    monkeypatch.setattr(llm.engine.processor, "prepare_image", _memo_returning(llm, c, poison))
    prompts = [
        ("USER: <image>\nOne? ASSISTANT:", [a]),
        ("USER: <image>\nTwo? ASSISTANT:", [c]),
        ("USER: <image>\nThree? ASSISTANT:", [b]),
        ("Text only, please.", []),
    ]
    outs = llm.generate([{"prompt": p, "images": i} for p, i in prompts], GREEDY, use_tqdm=False)
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert reasons[1] == "error" and "rejects this image" in outs[1].error
    for (prompt, imgs), out in zip(prompts, outs, strict=True):
        if out.outputs[0].finish_reason != "error":
            assert out.outputs[0].token_ids == reference.greedy(prompt, imgs, 8)
    assert reasons.count("error") == 1
    assert_no_leaks(llm)


def _memo_returning(llm, image, data):
    """Make every preprocessing of ``image`` return the very ``data`` object (so the fake
    encoder can recognise it by identity)."""
    real = llm.engine.processor.prepare_image

    def prepare(source, *args):
        prepared = real(source, *args)
        if source is image:
            return type(prepared)(prepared.mm_hash, data, prepared.length, prepared.size)
        return prepared

    return prepare


def test_a_fatal_device_error_fails_everything_and_marks_the_engine_dead(abc, monkeypatch):
    a, _, _ = abc
    llm = LLM("tiny-llava")

    def broken(sched):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(llm.engine.runner, "execute", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        llm.generate(
            {"prompt": "USER: <image>\nWhat? ASSISTANT:", "images": [a]}, GREEDY, use_tqdm=False
        )
    assert llm.engine.dead is not None
    with pytest.raises(RuntimeError, match="dead"):
        llm.generate("hello", GREEDY, use_tqdm=False)


# ---- 7. hash collisions and max_model_len --------------------------------------------------------
def test_hash_collision_is_a_miss(monkeypatch):
    import mmserve.multimodal.image.prep as processor_module

    monkeypatch.setattr(processor_module, "hash_image", lambda *args: "0" * 64)
    x, y = (png_bytes(make_image(5, (252, 252))), png_bytes(make_image(6, (504, 364))))
    prompts = [{"prompt": qwen_prompt(1), "images": [x]}, {"prompt": qwen_prompt(1), "images": [y]}]
    llm = LLM("tiny-qwen2-vl")
    outs = bounded_generate(llm, prompts)
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "length"]
    monkeypatch.undo()
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs("tiny-qwen2-vl", prompts)


def png_bytes(image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_max_model_len_beyond_the_kv_cache_is_refused():
    with pytest.raises(ValueError, match=r"max_model_len=4096.*64 tokens"):
        LLM("tiny-llava", num_kv_blocks=4, block_size=16)
    assert (
        LLM("tiny-llava", num_kv_blocks=4, block_size=16, max_model_len=64).engine.max_model_len
        == 64
    )


def test_a_fatal_error_in_the_server_engine_makes_health_fail(abc, monkeypatch):
    from mmserve.engine.errors import EngineShutdownError

    a, _, _ = abc
    llm_engine = LLMEngine.from_args("tiny-llava")

    def broken(sched):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(llm_engine.runner, "execute", broken)
    engine = AsyncLLMEngine(llm_engine)

    async def one():
        return [
            o
            async for o in engine.generate(
                PromptInput("USER: <image>\nWhat? ASSISTANT:", [a]), params=GREEDY
            )
        ]

    try:
        with pytest.raises(EngineShutdownError, match="device-side assert"):
            asyncio.run(one())
        engine._thread.join(5)
        with pytest.raises(EngineShutdownError, match="dead"):
            engine.check_health()
    finally:
        engine.shutdown()


def test_stall_steps_must_be_positive():
    with pytest.raises(ValueError, match="stall_steps must be >= 1, got 0"):
        LLM("tiny-llava", stall_steps=0)


def test_a_failure_outside_any_request_raises_instead_of_recursing(abc, monkeypatch):
    """A step with nothing scheduled (only ended requests to forget) that fails cannot be
    blamed on a request: it raises (on the first version it recursed without end)."""
    engine = LLMEngine.from_args("tiny-llava")
    req_id = engine.add_request(PromptInput("USER: <image>\nWhat? ASSISTANT:", [abc[0]]), GREEDY)
    engine.step()
    engine.abort_request([req_id])

    def broken(sched):
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(engine.runner, "execute", broken)
    with pytest.raises(RuntimeError, match="bookkeeping broke"):
        engine.step()


def test_rollback_of_a_step_other_than_the_last_is_refused():
    from mmserve.core.outputs import ModelRunnerOutput
    from tests.support.scheduler import make_request, make_scheduler

    sched = make_scheduler()
    sched.add_request(make_request("r", [20]))
    first = sched.schedule()
    sched.update(first, ModelRunnerOutput())
    with pytest.raises(ValueError, match="only the last scheduled"):
        sched.rollback_step(first)
