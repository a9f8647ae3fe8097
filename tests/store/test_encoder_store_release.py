"""A request lets go of the encoder store's host tensor once its load step ran (tiny-llava);
what it needs again after an eviction (a repeated image, a preemption) is encoded and the
answers stay those of the store-off engine."""

from __future__ import annotations

import dataclasses
import gc
import weakref

from mmserve import LLM, SamplingParams
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import PromptInput
from tests.support.engine import assert_no_leaks

PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"
PROMPT_ABA = "USER: <image>\n<image>\n<image>\nWhat differs? ASSISTANT:"
LONG = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def fill_store(tmp_path, images) -> str:
    """A disk store holding the images' embeddings; returns its directory."""
    store = str(tmp_path / "store")
    first = LLM("tiny-llava", encoder_store_dir=store)
    first.generate([{"prompt": PROMPT, "images": [img]} for img in images], LONG, use_tqdm=False)
    first.engine.close()  # the queued writes land
    return store


def answers(llm: LLM, prompts: list[dict]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, LONG, use_tqdm=False)]


def test_a_running_request_holds_no_store_tensor_after_its_load_step(tmp_path, images):
    store = fill_store(tmp_path, images[:1])
    # no L1 and no retained encoder-cache entry: the request would be the tensor's only holder
    engine = LLMEngine.from_args(
        "tiny-llava", encoder_store_dir=store, encoder_store_ram=0, enable_encoder_cache=False
    )
    processed = engine.intake.process(PromptInput(PROMPT, [images[0]]))
    engine.intake.wait_for_store([processed])
    req_id = engine.intake.add_processed(processed, LONG)  # the caller still holds ``processed``
    request = engine.scheduler.requests[req_id]
    tensor = weakref.ref(request.mm_items[0].stored)
    assert tensor() is not None
    engine.step()  # loads the image and prefills the prompt
    assert engine.get_metrics()["encoder_images_loaded"] == 1
    state = engine.runner.states[req_id]
    for items in (request.mm_items, state.mm_items, processed.mm_items):
        assert all(item.stored is None for item in items)
    engine.step()  # the worker drops the released entry
    gc.collect()
    assert req_id in engine.scheduler.requests and tensor() is None
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        tokens = next((o.outputs[0].token_ids for o in engine.step() if o.finished), tokens)
    assert tokens == answers(LLM("tiny-llava"), [{"prompt": PROMPT, "images": [images[0]]}])[0]


def test_repeated_image_and_preemption_encode_what_was_evicted_and_answer_the_same(
    tmp_path, images
):
    store = fill_store(tmp_path, images)
    repeated = [{"prompt": PROMPT_ABA, "images": [images[0], images[1], images[0]]}]
    squeezed = [{"prompt": PROMPT, "images": [img]} for img in images]
    # the first occurrence's entry is evicted as soon as it is computed (encoder cache off),
    # before the chunk that reaches the second one
    llm = LLM(
        "tiny-llava",
        encoder_store_dir=store,
        enable_encoder_cache=False,
        max_num_batched_tokens=300,
    )
    assert answers(llm, repeated) == answers(LLM("tiny-llava"), repeated)
    metrics = llm.get_metrics()
    assert metrics["encoder_images_loaded"] == 2 and metrics["encoder_images_encoded"] == 1
    assert_no_leaks(llm)
    # a resumed request recomputes its image: no prefix hit, no cached entry, no stored tensor
    llm = LLM(
        "tiny-llava",
        encoder_store_dir=store,
        enable_encoder_cache=False,
        enable_prefix_caching=False,
        num_kv_blocks=35,
        max_model_len=560,
        max_num_batched_tokens=512,
    )
    assert answers(llm, squeezed) == answers(LLM("tiny-llava"), squeezed)
    metrics = llm.get_metrics()
    assert metrics["num_preemptions"] > 0 and metrics["encoder_images_loaded"] == 4
    assert metrics["encoder_images_encoded"] >= 1
    assert_no_leaks(llm)


def squeezed_llm(store: str, **kw) -> LLM:
    """The first occurrence's entry is evicted before the chunk that reaches the repeat."""
    return LLM(
        "tiny-llava",
        encoder_store_dir=store,
        enable_encoder_cache=False,
        max_num_batched_tokens=300,
        **kw,
    )


def test_reencoding_an_image_the_store_holds_writes_nothing(tmp_path, images):
    store = fill_store(tmp_path, images[:2])
    llm = squeezed_llm(store)
    repeated = [{"prompt": PROMPT_ABA, "images": [images[0], images[1], images[0]]}]
    assert answers(llm, repeated) == answers(LLM("tiny-llava"), repeated)
    llm.engine.close()
    metrics = llm.get_metrics()
    assert metrics["encoder_images_loaded"] == 2 and metrics["encoder_images_encoded"] == 1
    assert metrics["encoder_store_writes"] == 0  # both were loaded from the store


def test_one_write_per_distinct_image_and_rewrites_after_the_store_lost_them(tmp_path, images):
    store = str(tmp_path / "store")
    # every lookup reaches the disk tier; no prefix hit skips the repeat's first image
    llm = squeezed_llm(store, encoder_store_ram=0, enable_prefix_caching=False)
    answers(llm, [{"prompt": PROMPT, "images": [img]} for img in images[:2]])
    llm.engine.store.flush()
    assert llm.get_metrics()["encoder_store_writes"] == 2
    repeated = [{"prompt": PROMPT_ABA, "images": [images[0], images[1], images[0]]}]
    answers(llm, repeated)  # loads A and B, then encodes A again: the store holds it
    llm.engine.store.flush()
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 3 and metrics["encoder_store_writes"] == 2
    for file in (tmp_path / "store").glob("*/*.mmes"):
        file.unlink()  # another process sharing the directory evicted them
    answers(llm, repeated)  # the lookups miss: A and B are written again, A's repeat is not
    llm.engine.close()
    metrics = llm.get_metrics()
    assert metrics["encoder_images_encoded"] == 6 and metrics["encoder_store_writes"] == 4
    assert len(list((tmp_path / "store").glob("*/*.mmes"))) == 2


def test_a_stored_embedding_that_does_not_fit_is_encoded_and_reported_encoded(tmp_path, images):
    """The worker encodes a planned load whose stored tensor does not fit its placeholder; the
    answer is the store-off engine's and ``usage.mm_inputs`` says "encoded", not "store"."""
    store = fill_store(tmp_path, images[:1])
    engine = LLMEngine.from_args("tiny-llava", encoder_store_dir=store)
    processed = engine.intake.process(PromptInput(PROMPT, [images[0]]))
    engine.intake.wait_for_store([processed])
    request = engine.scheduler.requests[engine.intake.add_processed(processed, LONG)]
    item = request.mm_items[0]
    assert item.stored is not None
    request.mm_items[0] = dataclasses.replace(item, stored=item.stored[:-1])  # a row short
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished), final)
    assert final is not None
    metrics = engine.get_metrics()
    assert metrics["encoder_store_load_failures"] == 1 and metrics["encoder_images_encoded"] == 1
    assert [(u.modality, u.source) for u in final.media_usage] == [("image", "encoded")]
    expected = answers(LLM("tiny-llava"), [{"prompt": PROMPT, "images": [images[0]]}])[0]
    assert final.outputs[0].token_ids == expected
