"""``n > 1`` through the engine: one output with n choices, the prompt admitted, encoded and
prefilled once (the other children hit its KV blocks), seeds derived per choice, an abort of
the parent ends every child."""

from __future__ import annotations

import pytest

from mmserve import LLM, SamplingParams
from mmserve.engine.output.fanout import child_id
from mmserve.inputs import PromptInput
from tests.support.engine import assert_no_leaks

BS = 16
PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llava", seed=0, block_size=BS)


def _image_request(images) -> dict:
    return {"prompt": PROMPT, "images": [images[0]]}


def test_greedy_n3_gives_three_identical_choices_equal_to_transformers(llm, reference, images):
    before = llm.get_metrics()
    params = SamplingParams(temperature=0, max_tokens=8, n=3)
    (out,) = llm.generate(_image_request(images), params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    expected = reference.greedy(PROMPT, [images[0]], 8)
    assert all(c.token_ids == expected for c in out.outputs)
    assert all(c.finish_reason == "length" for c in out.outputs) and out.finished
    after = llm.get_metrics()
    assert after["encoder_images_encoded"] - before["encoder_images_encoded"] == 1
    # the prompt is counted once, every choice's tokens are counted
    assert after["prompt_tokens"] - before["prompt_tokens"] == len(out.prompt_token_ids)
    assert after["generation_tokens"] - before["generation_tokens"] == 24
    assert_no_leaks(llm)


def test_children_share_the_prompt_blocks_and_are_admitted_together(llm, images):
    engine = llm.engine
    # a fresh image: nothing of this prompt is cached yet
    processed = engine.intake.process(PromptInput(PROMPT, [images[3]]))
    num_prompt = len(processed.prompt_token_ids)
    encoded = engine.get_metrics()["encoder_images_encoded"]
    parent = engine.intake.add_processed(
        processed, SamplingParams(temperature=0, max_tokens=4, n=3)
    )
    ids = [child_id(parent, i) for i in range(3)]
    engine.step()  # the prompt fits one step: child 0 prefills it, the others hit its blocks
    children = [engine.scheduler.requests[cid] for cid in ids]
    assert all(c.num_computed_tokens == num_prompt and c.output_token_ids for c in children)
    shared = (num_prompt - 1) // BS
    assert [c.num_cached_tokens for c in children] == [0, shared * BS, shared * BS]
    tables = [engine.scheduler.kv.block_ids(cid) for cid in ids]
    assert tables[1][:shared] == tables[0][:shared] == tables[2][:shared]
    tails = {block for table in tables for block in table[shared:]}
    assert len(tails) == sum(len(t) - shared for t in tables)  # only the prefix is shared
    assert engine.get_metrics()["encoder_images_encoded"] - encoded == 1
    engine.abort_request([parent])  # aborting the parent ends every child
    assert not engine.scheduler.requests and not engine.fanout.parents
    assert not engine.has_unfinished_requests()
    assert_no_leaks(llm)


def test_chunked_prefill_prompt_is_prefilled_once(reference, images):
    llm = LLM("tiny-llava", seed=0, block_size=BS, max_num_batched_tokens=128)
    params = SamplingParams(temperature=0, max_tokens=6, n=3)
    (out,) = llm.generate(_image_request(images), params, use_tqdm=False)
    expected = reference.greedy(PROMPT, [images[0]], 6)
    assert all(c.token_ids == expected for c in out.outputs)
    metrics = llm.get_metrics()
    shared = (len(out.prompt_token_ids) - 1) // BS * BS
    assert metrics["prefix_cache_hits"] == 2 * shared
    assert metrics["encoder_images_encoded"] == 1
    assert_no_leaks(llm)


def test_seeded_n_is_reproducible_and_choice_i_uses_seed_plus_i(llm):
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7)
    first = llm.generate("USER: Tell me a story. ASSISTANT:", params, use_tqdm=False)[0]
    again = llm.generate("USER: Tell me a story. ASSISTANT:", params, use_tqdm=False)[0]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    for i, choice in enumerate(first.outputs):
        single = SamplingParams(temperature=1.0, max_tokens=12, seed=7 + i)
        alone = llm.generate("USER: Tell me a story. ASSISTANT:", single, use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == choice.token_ids
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    assert_no_leaks(llm)


def test_n_without_prefix_caching_and_mixed_with_n1(images, reference):
    llm = LLM("tiny-llava", seed=0, enable_prefix_caching=False)
    params = [
        SamplingParams(temperature=0, max_tokens=5, n=2),
        SamplingParams(temperature=0, max_tokens=5),
    ]
    outs = llm.generate([_image_request(images), _image_request(images)], params, use_tqdm=False)
    expected = reference.greedy(PROMPT, [images[0]], 5)
    assert [len(o.outputs) for o in outs] == [2, 1]
    assert all(c.token_ids == expected for o in outs for c in o.outputs)
    assert_no_leaks(llm)


def test_n_is_validated(llm):
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingParams(n=0)
    processed = llm.engine.intake.process(PromptInput("hi"))
    with pytest.raises(ValueError, match="max_num_seqs"):
        llm.engine.intake.add_processed(processed, SamplingParams(n=1000))
