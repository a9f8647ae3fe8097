"""Which way each image / video of a request got its embeddings: encoded, loaded from the
encoder store, found in the encoder cache, or never needed because the prefix cache held the
image's KV (``RequestOutput.media_usage``, the usage object's ``mm_inputs``)."""

from __future__ import annotations

import pytest

from mmserve import LLM, SamplingParams
from mmserve.core.outputs import ModelRunnerOutput
from mmserve.engine.output.media_usage import summarize_media
from mmserve.inputs import MultiModalItem, VideoGroup
from mmserve.request import EmbeddingSource
from tests.support.scheduler import make_request, make_scheduler, run_to_completion

GREEDY = SamplingParams(temperature=0, max_tokens=4)
# the question is longer than a KV block: a repeat's prefix hit covers the whole image
ONE_IMAGE = "USER: <image>\nWhat is it? Describe its colors, its shapes and its mood. ASSISTANT:"
ENCODED, STORE = EmbeddingSource.ENCODED, EmbeddingSource.ENCODER_STORE
CACHE, PREFIX = EmbeddingSource.ENCODER_CACHE, EmbeddingSource.PREFIX_CACHE


def test_scheduler_records_encoded_then_cache_hit_per_occurrence():
    sched = make_scheduler(prefix_caching=False)
    first = make_request("a", [5, ("A", 10), 5, ("B", 10), 5, ("A", 10), 3])
    sched.add_request(first)
    run_to_completion(sched)
    assert first.mm_sources == [ENCODED, ENCODED, CACHE]
    again = make_request("b", [5, ("A", 10), 3])
    sched.add_request(again)
    run_to_completion(sched)
    assert again.mm_sources == [CACHE]


def test_an_image_inside_the_prefix_hit_is_never_walked():
    sched = make_scheduler(block_size=16)
    layout: list = [16, ("A", 16), 20]
    sched.add_request(make_request("a", layout))
    run_to_completion(sched)
    again = make_request("b", layout)
    sched.add_request(again)
    run_to_completion(sched)
    assert again.num_cached_tokens >= 32 and again.mm_sources == [PREFIX]
    usage = summarize_media(again.mm_items, again.mm_sources)
    assert [(u.modality, u.index, u.source) for u in usage] == [("image", 0, "prefix_cache")]


def test_a_request_resumed_onto_a_prefix_hit_reports_the_image_from_the_prefix_cache():
    """``b`` is preempted before its image; ``a`` computes the image's blocks meanwhile, so
    ``b``'s resume hits them: its first admission hit nothing, yet the image came from the
    prefix cache (it read ``not_computed`` when the label was inferred from the first hit)."""
    sched = make_scheduler(block_size=16, budget=16)
    layout: list = [16, ("A", 16), 20]
    first, second = make_request("a", layout), make_request("b", layout)
    sched.add_request(first)
    sched.add_request(second)
    sched.update(sched.schedule(only={"b"}), ModelRunnerOutput())  # b: its text [0, 16)
    sched.running.remove(second)
    sched._preempt(second)
    while not first.is_finished:  # a alone: it computes the image's blocks
        out = sched.schedule(only={"a"})
        done = first.num_computed_tokens == first.num_tokens
        sched.update(out, ModelRunnerOutput(sampled_token_ids={"a": 7} if done else {}))
    run_to_completion(sched)
    assert second.is_finished and second.num_cached_tokens == 0
    assert first.mm_sources == [ENCODED] and second.mm_sources == [PREFIX]


def test_a_rolled_back_step_forgets_the_sources_it_recorded():
    sched = make_scheduler()
    request = make_request("a", [5, ("A", 10), 5])
    sched.add_request(request)
    out = sched.schedule()
    assert request.mm_sources == [ENCODED]
    sched.rollback_step(out)
    assert request.mm_sources == [None]
    sched.update(sched.schedule(), ModelRunnerOutput())
    assert request.mm_sources == [ENCODED]


def test_the_costliest_source_of_an_item_wins():
    request = make_request("a", [5, ("A", 10), 5])
    request.note_mm_source(0, CACHE)
    request.note_mm_source(0, ENCODED)  # re-encoded after an eviction (e.g. on preemption)
    request.note_mm_source(0, CACHE)
    assert request.mm_sources == [ENCODED]


def test_summary_groups_video_frame_groups_and_pan_and_scan_crops_per_input():
    group = [VideoGroup(i, 3, 1.0) for i in range(3)]
    items = [
        MultiModalItem("img", 0, 4),
        MultiModalItem("vid.g0", 4, 2, video=group[0]),
        MultiModalItem("vid.g1", 6, 2, video=group[1]),
        MultiModalItem("vid.g2", 8, 2, video=group[2]),
        MultiModalItem("gem#0", 10, 3, crop=0),
        MultiModalItem("gem#1", 13, 3, crop=1),
        MultiModalItem("img", 16, 4),  # the first image again: a new input
        MultiModalItem("gem#0", 20, 3, crop=0),  # the crops' image again: a new input
        MultiModalItem("gem#1", 23, 3, crop=1),
    ]
    sources = [ENCODED, PREFIX, CACHE, ENCODED, STORE, CACHE, CACHE, None, None]
    usage = summarize_media(items, sources)
    assert [u.as_dict() for u in usage] == [
        {"type": "image", "index": 0, "tokens": 4, "source": "encoded",
         "pieces": {"encoded": 1}},
        {"type": "video", "index": 0, "tokens": 6, "source": "encoded",
         "pieces": {"prefix_cache": 1, "encoder_cache": 1, "encoded": 1}},
        {"type": "image", "index": 1, "tokens": 6, "source": "encoder_store",
         "pieces": {"encoder_store": 1, "encoder_cache": 1}},
        {"type": "image", "index": 2, "tokens": 4, "source": "encoder_cache",
         "pieces": {"encoder_cache": 1}},
        {"type": "image", "index": 3, "tokens": 6, "source": "not_computed",
         "pieces": {"not_computed": 2}},
    ]  # fmt: skip


def _sources(out) -> list[tuple[str, int, str]]:
    return [(u.modality, u.index, u.source) for u in out.media_usage]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_engine_reports_encoded_then_cached(images, prefix_caching):
    llm = LLM("tiny-llava", enable_prefix_caching=prefix_caching)
    first = llm.generate({"prompt": ONE_IMAGE, "images": [images[0]]}, GREEDY, use_tqdm=False)
    assert _sources(first[0]) == [("image", 0, "encoded")]
    assert first[0].media_usage[0].tokens == 256
    again = llm.generate({"prompt": ONE_IMAGE, "images": [images[0]]}, GREEDY, use_tqdm=False)
    cached = "prefix_cache" if prefix_caching else "encoder_cache"
    assert _sources(again[0]) == [("image", 0, cached)]
    text = llm.generate({"prompt": "USER: Hi ASSISTANT:"}, GREEDY, use_tqdm=False)
    assert text[0].media_usage == []


def test_engine_reports_store_loads(images, tmp_path):
    first = LLM("tiny-llava", encoder_store_dir=str(tmp_path / "store"))
    first.generate({"prompt": ONE_IMAGE, "images": [images[1]]}, GREEDY, use_tqdm=False)
    first.engine.close()
    restarted = LLM("tiny-llava", encoder_store_dir=str(tmp_path / "store"))
    out = restarted.generate({"prompt": ONE_IMAGE, "images": [images[1]]}, GREEDY, use_tqdm=False)
    assert _sources(out[0]) == [("image", 0, "encoder_store")]
