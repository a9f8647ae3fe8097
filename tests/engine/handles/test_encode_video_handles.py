"""Encode a video ahead, then name it by handle (offline ``LLM.encode``): every frame group is
encoded once, the chat by handle encodes nothing and answers as the video does; the items come
back in content order among the images; a video handle resolves only in its tenant, only as a
video (an image handle is no video either), and one whose embeddings are gone is a clear error."""

from __future__ import annotations

import base64

import pytest

from mmserve import LLM, SamplingParams
from mmserve.multimodal.handles import HandleRecord, MediaHandleError
from tests.engine.handles.test_encode_handles import chat_of, data_url, encoded, image_part
from tests.support.engine import assert_no_leaks
from tests.support.video import make_video

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def video_url(frames: int = 12, fps: int = 6, size: tuple[int, int] = (64, 48)) -> str:
    return "data:video/mp4;base64," + base64.b64encode(make_video(frames, fps, size)).decode()


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


@pytest.fixture(scope="module", params=["tiny-qwen2-vl", "tiny-llava-onevision"])
def llm(request) -> LLM:
    return LLM(request.param, limit_mm_per_prompt={"image": 2, "video": 2})


def test_encode_a_video_then_chat_by_handle_encodes_nothing_and_answers_the_same(llm):
    url = video_url()
    before = encoded(llm)
    [item] = llm.encode([video_part(url)])
    assert item["type"] == "video" and item["tokens"] > 0 and len(item["handle"]) == 64
    pieces = encoded(llm) - before
    assert pieces >= 2  # every frame group (or frame) of the video
    assert llm.get_metrics()["num_requests_running"] == 0
    assert llm.encode([video_part(url)]) == [item] and encoded(llm) - before == pieces
    before = encoded(llm)
    by_handle = llm.chat(chat_of(video_part(f"mmserve://{item['handle']}")), GREEDY, False)[0]
    assert encoded(llm) - before == 0
    sent = llm.chat(chat_of(video_part(url)), GREEDY, False, cache_salt="elsewhere")[0]
    assert encoded(llm) - before == pieces  # another tenant: encoded again
    assert by_handle.prompt_token_ids == sent.prompt_token_ids
    assert by_handle.outputs[0].token_ids == sent.outputs[0].token_ids
    assert_no_leaks(llm)


def test_items_come_back_in_content_order(llm):
    content = [image_part(data_url(11)), video_part(video_url(8)), image_part(data_url(12))]
    items = llm.encode(content, cache_salt="order")
    assert [item["type"] for item in items] == ["image", "video", "image"]
    handles = [f"mmserve://{item['handle']}" for item in items]
    before = encoded(llm)
    parts = [image_part(handles[0]), video_part(handles[1]), image_part(handles[2])]
    out = llm.chat(chat_of(*parts), GREEDY, False, cache_salt="order")[0]
    assert encoded(llm) - before == 0 and out.outputs[0].finish_reason in ("length", "stop")
    assert_no_leaks(llm)


def test_a_video_handle_resolves_only_in_its_tenant_and_only_as_a_video(llm):
    [video] = llm.encode([video_part(video_url(10))], cache_salt="a")
    [image] = llm.encode([image_part(data_url(13))], cache_salt="a")
    by_handle = chat_of(video_part(f"mmserve://{video['handle']}"))
    assert llm.chat(by_handle, GREEDY, False, cache_salt="a")[0].outputs[0].token_ids
    for salt in ("b", None):
        with pytest.raises(MediaHandleError, match="send the video again") as info:
            llm.chat(by_handle, GREEDY, False, cache_salt=salt)
        assert info.value.code == "media_handle_not_found"
    crossed = [
        (image_part(f"mmserve://{video['handle']}"), "is a video"),
        (video_part(f"mmserve://{image['handle']}"), "is an image"),
    ]
    for part, words in crossed:
        with pytest.raises(MediaHandleError, match=words) as info:
            llm.chat(chat_of(part), GREEDY, False, cache_salt="a")
        assert info.value.code == "media_handle_kind"
    with pytest.raises(ValueError, match="no uuid"):
        llm.chat(chat_of({"type": "video_url", "uuid": "clip"}), GREEDY, False)
    assert_no_leaks(llm)


def test_evicted_video_handle_asks_for_the_video_again():
    llm = LLM("tiny-qwen2-vl", encoder_cache_size=256)  # a 32-token video, 64-token images
    [first] = llm.encode([video_part(video_url(12, 6, (112, 112)))])
    for seed in (21, 22, 23, 24):
        llm.encode([image_part(data_url(seed, (224, 224)))])  # evict the video's groups
    with pytest.raises(MediaHandleError, match="send the video again") as info:
        llm.chat(chat_of(video_part(f"mmserve://{first['handle']}")), GREEDY, False)
    assert info.value.code == "media_handle_expired"
    assert_no_leaks(llm)


def test_video_handles_cross_engines_through_the_store(tmp_path):
    url = video_url(12, 6)
    maker = LLM("tiny-qwen2-vl", encoder_store_dir=str(tmp_path))
    [item] = maker.encode([video_part(url)], cache_salt="s")
    assert maker.engine.store is not None and maker.engine.store.flush(10)
    replica = LLM("tiny-qwen2-vl", encoder_store_dir=str(tmp_path))
    parts = chat_of(video_part(f"mmserve://{item['handle']}"))
    out = replica.chat(parts, GREEDY, False, cache_salt="s")[0]
    assert encoded(replica) == 0 and replica.get_metrics()["encoder_images_loaded"] >= 2
    sent = maker.chat(chat_of(video_part(url)), GREEDY, False, cache_salt="s")[0]
    assert out.outputs[0].token_ids == sent.outputs[0].token_ids


def test_a_video_record_round_trips_without_its_pixels():
    llm = LLM("tiny-qwen2-vl")
    prompt_parts = [video_part(video_url(8))]
    [item] = llm.encode(prompt_parts)
    record = llm.engine.handles.kept._local[item["handle"]]
    assert record.kind == "video" and record.item == item
    again = HandleRecord.from_bytes(record.to_bytes())
    assert again.kind == "video" and again.item == item
    assert len(record.to_bytes()) < 4096  # the patches are left out
