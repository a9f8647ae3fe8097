"""Regression tests from review: failed steps, client mistakes, preemption RNG, detokenizer."""

from __future__ import annotations

import random

import pytest

from mmserve import LLM, SamplingParams
from mmserve.engine.output.detokenizer import Detokenizer
from tests.support.engine import assert_no_leaks
from tests.support.scheduler import fake_step, make_request, make_scheduler

PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"


def test_failed_step_is_retried_and_leaves_no_stale_prefix_hits(images, monkeypatch):
    llm = LLM("tiny-llava")
    request = {"prompt": PROMPT, "images": [images[0]]}
    params = SamplingParams(temperature=0, max_tokens=8)
    runner = llm.engine.runner
    real, registered = runner.execute, []

    def fail_once(sched):
        monkeypatch.setattr(runner, "execute", real)
        registered.extend(llm.engine.scheduler.kv.pool.cached)  # what the step registered
        raise RuntimeError("device hiccup")

    monkeypatch.setattr(runner, "execute", fail_once)
    out = llm.generate(request, params, use_tqdm=False)[0]  # retried alone, succeeds
    assert registered  # the failed step had registered full blocks...
    assert_no_leaks(llm)
    clean = LLM("tiny-llava").generate(request, params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == clean.outputs[0].token_ids
    assert out.num_cached_tokens == 0  # the retry did not hit the failed step's blocks


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seed": 2**64}, "seed"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
    ],
)
def test_out_of_range_sampling_values_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_tiny_temperature_samples_greedily(images):
    llm = LLM("tiny-llava")
    request = {"prompt": PROMPT, "images": [images[0]]}
    greedy = llm.generate(request, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    tiny = llm.generate(request, SamplingParams(temperature=1e-40, max_tokens=8), use_tqdm=False)
    assert tiny[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids


def test_seeded_sampling_survives_preemption(images):
    prompts = [
        {"prompt": f"USER: <image>\nQuestion {i}? ASSISTANT:", "images": [images[i]]}
        for i in range(4)
    ]
    params = [
        SamplingParams(temperature=1.0, seed=10 + i, max_tokens=32, ignore_eos=True)
        for i in range(4)
    ]
    alone = [
        LLM("tiny-llava").generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids
        for p, sp in zip(prompts, params, strict=True)
    ]
    squeezed = LLM("tiny-llava", num_kv_blocks=35, max_model_len=560, max_num_batched_tokens=512)
    outs = squeezed.generate(prompts, params, use_tqdm=False)
    assert squeezed.get_metrics()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert_no_leaks(squeezed)


def test_same_image_twice_keeps_its_reference_until_the_second_copy_is_computed():
    sched = make_scheduler(budget=45, encoder_capacity=100)
    sched.add_request(make_request("r", [10, ("x", 20), 10, ("x", 20)]))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"r": 45} and out.scheduled_encoder_inputs == {"r": [0]}
    assert sched.encoder_cache.is_referenced_by("x:20", "r")  # mid second copy


def test_disable_chunked_mm_input_when_the_chunk_starts_at_the_image():
    sched = make_scheduler(budget=32, max_num_seqs=4, disable_chunked_mm_input=True)
    for i in range(3):
        sched.add_request(make_request(f"d{i}", [4], max_tokens=20))
    fake_step(sched)  # three requests now decode one token per step
    sched.add_request(make_request("b", [20, ("img", 30), 5]))
    out = fake_step(sched)
    assert out.num_scheduled_tokens["b"] == 20  # stops before the image
    out = fake_step(sched)
    assert "b" not in out.num_scheduled_tokens  # 29 tokens left cannot hold the 30-token image


def test_incremental_detokenizer_matches_full_decode():
    tokenizer = LLM("tiny-llava").get_tokenizer()
    detok = Detokenizer(tokenizer)
    rng = random.Random(0)
    for trial in range(20):
        ids = [rng.randrange(5, tokenizer.vocab_size) for _ in range(rng.randrange(1, 60))]
        req = f"r{trial}"
        for n in range(1, len(ids)):
            partial = detok.update(req, ids[:n])
            full = tokenizer.decode(ids[:n], skip_special_tokens=True)
            assert full.startswith(partial)
        assert detok.finish(req, ids) == tokenizer.decode(ids, skip_special_tokens=True)
