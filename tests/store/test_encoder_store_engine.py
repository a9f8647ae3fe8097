"""The encoder store under the engine (tiny-llava): restarts load instead of encoding,
damaged entries cost one re-encode, keys never cross salt / weights, answers never change."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from mmserve import LLM, SamplingParams
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput
from mmserve.models.tiny import resolve_model_path
from tests.support.engine import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"


def ask(llm: LLM, images, salt: str | None = None, prompt: str = PROMPT) -> list[list[int]]:
    prompts = [{"prompt": prompt, "images": [img], "cache_salt": salt} for img in images]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outs]


QWEN_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?<|im_end|>"


def stored_llm(model: str, tmp_path, **kw) -> LLM:
    return LLM(model, encoder_store_dir=str(tmp_path / "store"), **kw)


def finish(llm: LLM) -> dict[str, float]:
    llm.engine.close()  # the queued writes land (what a restart relies on)
    return llm.get_metrics()


@pytest.fixture(scope="module")
def plain_answers(images):
    return ask(LLM("tiny-llava"), images[:2])


def test_store_off_is_todays_engine(images, plain_answers):
    llm = LLM("tiny-llava")
    assert llm.engine.store is None and llm.engine.runner.encoder.sink is None
    assert ask(llm, images[:2]) == plain_answers
    assert llm.get_metrics()["encoder_store_loads"] == 0


def test_restart_with_disk_tier_encodes_nothing_seen_and_answers_the_same(
    tmp_path, images, plain_answers
):
    first = stored_llm("tiny-llava", tmp_path)
    assert ask(first, images[:2]) == plain_answers
    metrics = finish(first)
    assert metrics["encoder_images_encoded"] == 2 and metrics["encoder_store_writes"] == 2
    restarted = stored_llm("tiny-llava", tmp_path)
    assert ask(restarted, images[:2]) == plain_answers
    metrics = restarted.get_metrics()
    assert metrics["encoder_images_encoded"] == 0
    assert metrics["encoder_store_loads"] == metrics["encoder_images_loaded"] == 2
    assert metrics["encoder_store_disk_hits"] == 2 and metrics["encoder_store_disk_bytes"] > 0
    assert_no_leaks(restarted)


def test_tampered_and_truncated_entries_cost_exactly_one_reencode_each(
    tmp_path, images, plain_answers
):
    first = stored_llm("tiny-llava", tmp_path)
    ask(first, images[:2])
    finish(first)
    files = sorted((tmp_path / "store").glob("*/*.mmes"))
    assert len(files) == 2
    tampered = bytearray(files[0].read_bytes())
    tampered[len(tampered) // 2] ^= 0x55
    files[0].write_bytes(bytes(tampered))
    files[1].write_bytes(files[1].read_bytes()[:100])
    second = stored_llm("tiny-llava", tmp_path)
    assert ask(second, images[:2]) == plain_answers
    metrics = finish(second)
    assert metrics["encoder_images_encoded"] == 2 and metrics["encoder_store_loads"] == 0
    assert metrics["encoder_store_corrupt_entries"] == 2
    assert metrics["encoder_store_mac_failures"] == 2  # a cut past the header fails the MAC
    third = stored_llm("tiny-llava", tmp_path)  # the re-encodes were written back
    assert ask(third, images[:2]) == plain_answers
    assert third.get_metrics()["encoder_images_encoded"] == 0


def test_other_salt_or_other_weights_never_hit(tmp_path, images):
    model = tmp_path / "model"
    shutil.copytree(resolve_model_path("tiny-llava"), model)
    first = stored_llm(str(model), tmp_path)
    ask(first, images[:1])
    finish(first)
    salted = stored_llm(str(model), tmp_path)
    ask(salted, images[:1], salt="tenant-b")
    assert salted.get_metrics()["encoder_store_loads"] == 0
    weights = sorted(model.glob("*.safetensors"))[0]  # same path and name, new weights
    data = bytearray(weights.read_bytes())
    data[-2] ^= 0x01  # the last weight changes in its mantissa
    weights.write_bytes(bytes(data))
    retrained = stored_llm(str(model), tmp_path)
    ask(retrained, images[:1])
    metrics = retrained.get_metrics()
    assert metrics["encoder_store_loads"] == 0 and metrics["encoder_images_encoded"] == 1


def test_other_dtype_never_hits(tmp_path, images):
    first = stored_llm("tiny-llava", tmp_path)
    ask(first, images[:1])
    finish(first)
    half = stored_llm("tiny-llava", tmp_path, dtype="bfloat16")
    ask(half, images[:1])
    metrics = half.get_metrics()
    assert metrics["encoder_store_loads"] == 0 and metrics["encoder_images_encoded"] == 1


def test_restart_loads_qwen2_vl_items_of_different_sizes(tmp_path, images):
    plain = ask(LLM("tiny-qwen2-vl"), images, prompt=QWEN_PROMPT)
    first = stored_llm("tiny-qwen2-vl", tmp_path)
    assert ask(first, images, prompt=QWEN_PROMPT) == plain
    finish(first)
    restarted = stored_llm("tiny-qwen2-vl", tmp_path)
    assert ask(restarted, images, prompt=QWEN_PROMPT) == plain
    metrics = restarted.get_metrics()
    assert metrics["encoder_images_encoded"] == 0 and metrics["encoder_store_loads"] == 4


def test_l1_keeps_what_the_device_cache_evicted(images, plain_answers):
    llm = LLM("tiny-llava", encoder_store_ram=64 << 20, enable_encoder_cache=False)
    assert ask(llm, images[:2]) == plain_answers
    llm.engine.store.flush(5)
    assert ask(llm, images[:2]) == plain_answers
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 2 and metrics["encoder_store_ram_hits"] == 2
    assert metrics["encoder_store_loads"] == 2


def test_server_admission_awaits_lookups_and_a_restart_loads(tmp_path, images, plain_answers):
    async def serve_once() -> tuple[list[list[int]], dict[str, float]]:
        engine = LLMEngine.from_args("tiny-llava", encoder_store_dir=str(tmp_path / "store"))
        server = AsyncLLMEngine(engine)
        try:
            answers = []
            for image in images[:2]:
                async for out in server.generate(PromptInput(PROMPT, [image]), params=GREEDY):
                    final = out
                answers.append(final.outputs[0].token_ids)
        finally:
            server.shutdown()  # closes the store: its queued writes land
        return answers, engine.get_metrics()

    answers, metrics = asyncio.run(serve_once())
    assert answers == plain_answers and metrics["encoder_images_encoded"] == 2
    answers, metrics = asyncio.run(serve_once())
    assert answers == plain_answers
    assert metrics["encoder_images_encoded"] == 0 and metrics["encoder_store_loads"] == 2
