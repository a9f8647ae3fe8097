"""Encode ahead, then refer to the image by handle (offline ``LLM.encode``): the chat by handle
encodes nothing and answers as the image does; a handle resolves only within its tenant and its
model; one whose embedding is gone everywhere is a clear error, never a wrong answer."""

from __future__ import annotations

import base64
import io

import pytest

from mmserve import LLM, SamplingParams
from mmserve.multimodal.handles import MediaHandleError
from tests.support.engine import assert_no_leaks
from tests.support.images import make_image

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def data_url(seed: int, size: tuple[int, int] = (64, 48)) -> str:
    buf = io.BytesIO()
    make_image(seed, size).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str, uuid: str | None = None) -> dict:
    part: dict = {"type": "image_url", "image_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def chat_of(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


def encoded(llm: LLM) -> float:
    return llm.get_metrics()["encoder_images_encoded"]


@pytest.fixture(scope="module", params=["tiny-llava", "tiny-qwen2-vl"])
def llm(request) -> LLM:
    return LLM(request.param)


def test_encode_then_chat_by_handle_encodes_nothing_and_answers_the_same(llm):
    url = data_url(1)
    before = encoded(llm)
    [item] = llm.encode([image_part(url)])
    assert item["type"] == "image" and item["tokens"] > 0
    assert encoded(llm) - before == 1  # the encode ran the vision encoder once
    assert llm.get_metrics()["num_requests_running"] == 0  # no LM work
    before = encoded(llm)
    by_handle = llm.chat(chat_of(image_part(f"mmserve://{item['handle']}")), GREEDY, False)[0]
    assert encoded(llm) - before == 0
    # the same image as bytes, in another tenant (so nothing is shared): encoded, same answer
    sent = llm.chat(chat_of(image_part(url)), GREEDY, False, cache_salt="other")[0]
    assert encoded(llm) - before == 1
    assert by_handle.outputs[0].token_ids == sent.outputs[0].token_ids
    assert by_handle.prompt_token_ids == sent.prompt_token_ids
    assert_no_leaks(llm)


def test_encode_twice_is_one_encode_and_the_same_handle(llm):
    url = data_url(2)
    before = encoded(llm)
    first = llm.encode([image_part(url)])
    again = llm.encode([image_part(url)])
    assert first == again and encoded(llm) - before == 1


def test_a_handle_resolves_only_in_its_tenant(llm):
    [item] = llm.encode([image_part(data_url(3))], cache_salt="tenant-a")
    parts = chat_of(image_part(f"mmserve://{item['handle']}"))
    ok = llm.chat(parts, GREEDY, False, cache_salt="tenant-a")[0]
    assert ok.outputs[0].finish_reason in ("length", "stop")
    for salt in ("tenant-b", None):
        with pytest.raises(MediaHandleError, match="send the image again") as info:
            llm.chat(parts, GREEDY, False, cache_salt=salt)
        assert info.value.code == "media_handle_not_found"
    assert_no_leaks(llm)


def test_uuid_without_data_names_the_image_sent_with_it(llm):
    url = data_url(4)
    [item] = llm.encode([image_part(url, uuid="photo-4")], cache_salt="t")
    before = encoded(llm)
    bare = {"type": "image_url", "uuid": "photo-4"}
    by_uuid = llm.chat(chat_of(bare), GREEDY, False, cache_salt="t")[0]
    by_handle = llm.chat(chat_of(image_part(f"mmserve://{item['handle']}")), GREEDY, False,
                         cache_salt="t")[0]  # fmt: skip
    assert encoded(llm) - before == 0
    assert by_uuid.outputs[0].token_ids == by_handle.outputs[0].token_ids
    with pytest.raises(MediaHandleError, match="uuid"):
        llm.chat(chat_of(bare), GREEDY, False, cache_salt="another")


def test_a_chat_that_sends_an_image_with_a_uuid_lets_the_next_name_it_by_uuid(llm):
    """vLLM's shape: a client sends the image once with its ``uuid``, then only the ``uuid``;
    the second chat encodes nothing and answers as the image does, within its tenant only."""
    url = data_url(5)
    first = llm.chat(chat_of(image_part(url, uuid="photo-5")), GREEDY, False, cache_salt="u")[0]
    before = encoded(llm)
    bare = {"type": "image_url", "uuid": "photo-5"}
    again = llm.chat(chat_of(bare), GREEDY, False, cache_salt="u")[0]
    assert encoded(llm) - before == 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert again.prompt_token_ids == first.prompt_token_ids
    with pytest.raises(MediaHandleError, match="uuid"):
        llm.chat(chat_of(bare), GREEDY, False, cache_salt="another")
    assert_no_leaks(llm)


def test_a_uuid_named_in_the_same_batch_as_its_image_is_served_and_encoded_once(llm):
    """Offline, one ``chat`` call: the first conversation sends the image with its ``uuid``,
    the second names only the ``uuid``. Both are admitted before any step encodes, so the
    second borrows the first's pixels (the same item key: encoded once, then shared) instead
    of failing as "expired"."""
    url = data_url(6)
    bare = {"type": "image_url", "uuid": "photo-6"}
    before = encoded(llm)
    sent, named = llm.chat(
        [chat_of(image_part(url, uuid="photo-6")), chat_of(bare)], GREEDY, False, cache_salt="b"
    )
    assert encoded(llm) - before == 1
    assert named.outputs[0].token_ids == sent.outputs[0].token_ids
    assert named.prompt_token_ids == sent.prompt_token_ids
    assert_no_leaks(llm)


@pytest.mark.parametrize(
    "url, message",
    [
        ("mmserve://not-a-handle", "malformed media handle"),
        ("mmserve://" + "ab" * 32, "unknown"),
    ],
)
def test_bad_handles_are_clear_errors(llm, url, message):
    with pytest.raises(MediaHandleError, match=message):
        llm.chat(chat_of(image_part(url)), GREEDY, False)
    assert_no_leaks(llm)


def test_evicted_handle_asks_for_the_image_again():
    llm = LLM("tiny-llava", encoder_cache_size=300)  # room for one image (no store)
    [first] = llm.encode([image_part(data_url(5))])
    llm.encode([image_part(data_url(6))])  # evicts the first
    with pytest.raises(MediaHandleError, match="send the image again") as info:
        llm.chat(chat_of(image_part(f"mmserve://{first['handle']}")), GREEDY, False)
    assert info.value.code == "media_handle_expired"
    assert_no_leaks(llm)


def test_a_uuid_whose_image_is_done_and_evicted_asks_for_it_again():
    """The lent pixels live only as long as the prompt that sent them: once it is done and
    its embedding evicted, naming the uuid is "expired", not a hidden copy of the image."""
    llm = LLM("tiny-llava", encoder_cache_size=300)  # room for one image (no store)
    llm.chat(chat_of(image_part(data_url(8), uuid="photo-8")), GREEDY, False)
    llm.chat(chat_of(image_part(data_url(9))), GREEDY, False)  # evicts the first
    with pytest.raises(MediaHandleError, match="send the image again") as info:
        llm.chat(chat_of({"type": "image_url", "uuid": "photo-8"}), GREEDY, False)
    assert info.value.code == "media_handle_expired"
    assert_no_leaks(llm)


def test_handles_cross_engines_through_the_store_but_not_models(tmp_path):
    url = data_url(7)
    maker = LLM("tiny-llava", encoder_store_dir=str(tmp_path))
    [item] = maker.encode([image_part(url)])
    assert maker.engine.store is not None and maker.engine.store.flush(10)
    replica = LLM("tiny-llava", encoder_store_dir=str(tmp_path))
    parts = chat_of(image_part(f"mmserve://{item['handle']}"))
    out = replica.chat(parts, GREEDY, False)[0]
    assert encoded(replica) == 0 and replica.get_metrics()["encoder_images_loaded"] == 1
    assert (
        out.outputs[0].token_ids
        == maker.chat(chat_of(image_part(url)), GREEDY, False)[0].outputs[0].token_ids
    )
    other_model = LLM("tiny-qwen2-vl", encoder_store_dir=str(tmp_path))
    with pytest.raises(MediaHandleError, match="unknown"):
        other_model.chat(parts, GREEDY, False)


def test_encode_refuses_what_chat_refuses():
    llm = LLM("tiny-llava", limit_mm_per_prompt={"image": 2})
    with pytest.raises(ValueError, match="exceed the limit"):
        llm.encode([image_part(data_url(i)) for i in range(3)])
    with pytest.raises(ValueError, match="handle"):
        llm.encode([image_part("mmserve://" + "ab" * 32)])
    with pytest.raises(ValueError, match="one or more images"):
        llm.encode([{"type": "text", "text": "hi"}])
