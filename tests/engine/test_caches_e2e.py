"""End to end with tiny-llava: encoder cache and multimodal prefix cache change speed, not
answers (every output is compared with transformers computed in this run)."""

from __future__ import annotations

import pytest

from mmserve import LLM, SamplingParams
from tests.support.engine import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=24)
BS = 16


def prompt_with(n_images: int, question: str) -> str:
    return "USER: " + "<image>\n" * n_images + question + " ASSISTANT:"


def run(llm, reference, cases, params=GREEDY):
    outs = llm.generate([{"prompt": p, "images": i} for p, i in cases], params, use_tqdm=False)
    for (prompt, imgs), out in zip(cases, outs, strict=True):
        expected = reference.greedy(prompt, imgs, params.max_tokens)
        assert out.outputs[0].token_ids == expected, prompt
    return outs


def test_same_image_in_two_requests_encoded_once(reference, images):
    llm = LLM("tiny-llava", enable_prefix_caching=False)
    run(llm, reference, [(prompt_with(1, "What is it?"), [images[0]])])
    run(llm, reference, [(prompt_with(1, "Describe the colors."), [images[0]])])
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 1
    assert metrics["encoder_cache_hits"] == 1 and metrics["encoder_cache_misses"] == 1
    assert metrics["encoder_embeddings_from_cache"] == 256
    assert_no_leaks(llm)


def test_encoder_cache_off_reencodes_across_requests(reference, images):
    llm = LLM("tiny-llava", enable_prefix_caching=False, enable_encoder_cache=False)
    cases = [(prompt_with(1, "What is it?"), [images[0]])]
    run(llm, reference, cases)
    run(llm, reference, cases)
    assert llm.get_metrics()["encoder_images_encoded"] == 2
    assert llm.get_metrics()["encoder_cache_bytes"] == 0
    assert_no_leaks(llm)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_four_turn_chat_encodes_each_image_once(reference, images, prefix_caching):
    llm = LLM("tiny-llava", enable_prefix_caching=prefix_caching)
    tokenizer = llm.get_tokenizer()
    conv: list[dict] = []
    turn_images: list = []
    previous_prompt_len = 0
    for turn in range(4):
        new_image = images[turn % 2]  # turns 3 and 4 resend images already seen
        parts = [{"type": "image"}, {"type": "text", "text": f"Q{turn}?"}]
        conv.append({"role": "user", "content": parts})
        turn_images.append(new_image)
        prompt = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
        out = run(llm, reference, [(prompt, list(turn_images))])[0]
        if prefix_caching and turn:
            # the whole previous conversation's full blocks come from the prefix cache
            assert out.num_cached_tokens >= previous_prompt_len // BS * BS
        previous_prompt_len = len(out.prompt_token_ids)
        conv.append({"role": "assistant", "content": out.outputs[0].text})
    assert llm.get_metrics()["encoder_images_encoded"] == 2  # two distinct images
    assert_no_leaks(llm)


def test_tiny_encoder_cache_evicts_every_step_and_outputs_stay_identical(reference, images):
    llm = LLM(
        "tiny-llava",
        encoder_cache_size=256,
        enable_prefix_caching=False,
        max_num_batched_tokens=300,
    )
    cases = [
        (prompt_with(3, "Compare."), [images[0], images[1], images[2]]),
        (prompt_with(2, "Which?"), [images[3], images[0]]),
    ]
    run(llm, reference, cases)
    metrics = llm.get_metrics()
    assert metrics["encoder_cache_evictions"] >= 4
    assert_no_leaks(llm)


def _block_aligned_prompt(tokenizer, budget_tokens: int) -> str:
    """A prompt whose length is a multiple of BS with the image ending inside the last block."""
    for n in range(60):
        prompt = "USER:" + " red" * n + " <image>\nOk ASSISTANT:"
        length = len(tokenizer(prompt)["input_ids"]) + 255  # one <image> becomes 256
        tail = len(tokenizer("\nOk ASSISTANT:", add_special_tokens=False)["input_ids"])
        if length % BS == 0 and tail < BS - 1:
            assert 256 > budget_tokens
            return prompt
    raise AssertionError("no block-aligned prompt found")


def test_vllm_crash_scenario_two_identical_requests_with_image_larger_than_the_batch(
    reference, images
):
    llm = LLM("tiny-llava", max_num_batched_tokens=128, block_size=BS)
    prompt = _block_aligned_prompt(llm.get_tokenizer(), 128)
    cases = [(prompt, [images[1]]), (prompt, [images[1]])]
    outs = run(llm, reference, cases)
    assert len(outs[0].prompt_token_ids) % BS == 0
    assert llm.get_metrics()["encoder_images_encoded"] == 1
    assert_no_leaks(llm)


def test_vllm_crash_scenario_with_the_image_evicted_before_the_second_request(reference, images):
    llm = LLM("tiny-llava", max_num_batched_tokens=128, block_size=BS, encoder_cache_size=256)
    prompt = _block_aligned_prompt(llm.get_tokenizer(), 128)
    first = run(llm, reference, [(prompt, [images[1]])])[0]
    run(llm, reference, [(prompt_with(1, "Other."), [images[2]])])  # evicts images[1]
    second = run(llm, reference, [(prompt, [images[1]])])[0]
    # the prefix hit stops one block short of the end, i.e. inside the image: it is re-encoded
    assert second.num_cached_tokens == len(first.prompt_token_ids) - BS
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 3 and metrics["encoder_cache_evictions"] >= 1
    assert_no_leaks(llm)


def test_prefix_cache_hits_misses_and_cache_off_parity(reference, images):
    cases = [(prompt_with(1, "What is it?"), [images[0]])]
    on = LLM("tiny-llava")
    off = LLM("tiny-llava", enable_prefix_caching=False)
    first = run(on, reference, cases)[0]
    repeat = run(on, reference, cases)[0]
    n = len(first.prompt_token_ids)
    assert first.num_cached_tokens == 0
    assert repeat.num_cached_tokens == (n - 1) // BS * BS
    other = run(on, reference, [(prompt_with(1, "What is it?"), [images[1]])])[0]
    image_offset = first.prompt_token_ids.index(on.engine.config.model.image_token_id)
    assert other.num_cached_tokens == image_offset // BS * BS
    assert run(off, reference, cases)[0].outputs[0].token_ids == repeat.outputs[0].token_ids
    metrics = on.get_metrics()
    assert metrics["prefix_cache_queries"] == 3 * n
    assert metrics["prefix_cache_hits"] == repeat.num_cached_tokens + other.num_cached_tokens
    assert off.get_metrics()["prefix_cache_hits"] == 0


def test_cache_salt_isolates_tenants(images):
    llm = LLM("tiny-llava")
    request = {"prompt": prompt_with(1, "Hi"), "images": [images[0]], "cache_salt": "a"}
    llm.generate(request, GREEDY, use_tqdm=False)
    same = llm.generate(request, GREEDY, use_tqdm=False)[0]
    other = llm.generate({**request, "cache_salt": "b"}, GREEDY, use_tqdm=False)[0]
    assert same.num_cached_tokens > 0 and other.num_cached_tokens == 0


def test_identical_requests_in_one_step_share_prefix_blocks(reference, images):
    llm = LLM("tiny-llava")
    cases = [(prompt_with(1, "Same?"), [images[2]])] * 2
    first, second = run(llm, reference, cases)
    n = len(first.prompt_token_ids)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (n - 1) // BS * BS  # hit blocks scheduled this very step
    assert llm.get_metrics()["encoder_images_encoded"] == 1
    assert_no_leaks(llm)
