"""The Ray ingress' admission of media handles, without Ray: with the replicas' shared Redis
store, ``FrontendEngine`` resolves a handle an engine made (its record read from Redis) into
the prompt the image itself gives, marks its item as by handle (the replica loads it), and
keeps other tenants out; without a shared store it refuses handles in one clear line."""

from __future__ import annotations

import pickle

import pytest

from mmserve import LLM
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.chat_utils import chat_to_prompt
from mmserve.entrypoints.ray.blanks import pack_blanks, unpack_blanks
from mmserve.entrypoints.ray.frontend import FrontendEngine, ReplicaFacts
from mmserve.inputs import PromptInput
from mmserve.multimodal.handles import MediaHandleError
from mmserve.multimodal.media.policy import MediaFetchPolicy
from tests.engine.handles.test_encode_handles import chat_of, data_url, image_part

MODEL = "tiny-llava"
SECRET = "ray-ingress-handles-secret-0123"


def frontend_of(replica: LLM, model: str = MODEL, **args: object) -> FrontendEngine:
    engine = replica.engine
    facts = ReplicaFacts(
        vocab_size=engine.vocab_size,
        encoder_cache_capacity=engine.scheduler.encoder_cache.capacity,
        encoder_budget=engine.encoder_budget,
        store_fingerprint=None if engine.store is None else engine.store.keyer.fingerprint,
    )
    policy = MediaFetchPolicy(allowed_local_path=None)
    return FrontendEngine(EngineArgs(model=model, **args), facts, policy)  # type: ignore[arg-type]


def prompt_of(frontend: FrontendEngine, url: str, salt: str | None) -> PromptInput:
    return chat_to_prompt(
        frontend.tokenizer, chat_of(image_part(url)), salt, frontend.chat_template
    )


@pytest.fixture(scope="module")
def shared(module_redis_server) -> tuple[LLM, FrontendEngine]:
    store = {"encoder_store_redis": module_redis_server.url, "encoder_store_secret": SECRET}
    replica = LLM(MODEL, **store)
    return replica, frontend_of(replica, **store)


def test_the_ingress_resolves_a_replicas_handle_from_the_shared_store(shared) -> None:
    replica, frontend = shared
    url = data_url(3)
    [item] = replica.encode([image_part(url)], cache_salt="tenant-a")
    assert replica.engine.store is not None and replica.engine.store.flush(10)
    by_handle = frontend.process(prompt_of(frontend, f"mmserve://{item['handle']}", "tenant-a"))
    sent = frontend.process(prompt_of(frontend, url, "tenant-a"))
    assert by_handle.prompt_token_ids == sent.prompt_token_ids
    [handled], [plain] = by_handle.mm_items, sent.mm_items
    assert handled.key == plain.key and handled.hash.split("#", 1)[0] == item["handle"]
    assert handled.by_handle and not plain.by_handle  # the replica loads it, never encodes
    # what the ingress sends a replica: no pixels, nor their blanked stand-ins' bytes
    packed = pickle.loads(pickle.dumps(pack_blanks(by_handle)))
    assert len(pickle.dumps(pack_blanks(by_handle))) < len(pickle.dumps(sent)) / 4
    unpack_blanks(packed)
    assert packed.mm_items[0].data.shape == handled.data.shape and not packed.mm_items[0].data.any()


def test_a_handle_stays_refused_for_another_tenant_and_unknown_ones(shared) -> None:
    replica, frontend = shared
    [item] = replica.encode([image_part(data_url(4))], cache_salt="tenant-a")
    assert replica.engine.store is not None and replica.engine.store.flush(10)
    for salt, handle in (("tenant-b", item["handle"]), (None, item["handle"]), ("x", "ab" * 32)):
        with pytest.raises(MediaHandleError) as err:
            frontend.process(prompt_of(frontend, f"mmserve://{handle}", salt))
        assert err.value.code == "media_handle_not_found"


def test_without_a_shared_store_the_ingress_refuses_handles_and_says_why() -> None:
    frontend = frontend_of(LLM(MODEL))
    with pytest.raises(MediaHandleError, match="--encoder-store-redis") as err:
        frontend.process(prompt_of(frontend, "mmserve://" + "ab" * 32, None))
    assert err.value.code == "media_handle_unsupported"
    assert frontend.handles is None


def test_a_media_handle_error_crosses_process_boundaries_with_its_code() -> None:
    """Ray pickles a replica's exception for the ingress, which maps its ``code`` to the 400."""
    err = pickle.loads(pickle.dumps(MediaHandleError("gone", "media_handle_expired")))
    assert isinstance(err, MediaHandleError) and err.code == "media_handle_expired"
    assert str(err) == "gone"


def test_the_ingress_resolves_a_video_handle_and_marks_every_piece(module_redis_server) -> None:
    """A video handle a replica made names the video's pieces (their keys the handle plus a
    suffix); the ingress gives the prompt the video gives and marks each piece as by handle."""
    from tests.engine.handles.test_encode_video_handles import video_part, video_url

    store = {"encoder_store_redis": module_redis_server.url, "encoder_store_secret": SECRET}
    model, limits = "tiny-qwen2-vl", {"image": 2, "video": 2}
    replica = LLM(model, limit_mm_per_prompt=limits, **store)
    engine = replica.engine
    frontend = frontend_of(replica, model, limit_mm_per_prompt=limits, **store)
    url = video_url()
    [item] = replica.encode([video_part(url)], cache_salt="tenant-a")
    assert item["type"] == "video" and engine.store is not None and engine.store.flush(10)

    def prompt(part: dict, salt: str | None) -> PromptInput:
        chat = chat_of(part)
        return chat_to_prompt(frontend.tokenizer, chat, salt, frontend.chat_template)

    by_handle = frontend.process(prompt(video_part(f"mmserve://{item['handle']}"), "tenant-a"))
    sent = frontend.process(prompt(video_part(url), "tenant-a"))
    assert by_handle.prompt_token_ids == sent.prompt_token_ids
    assert len(by_handle.mm_items) == len(sent.mm_items) >= 2
    assert [i.key for i in by_handle.mm_items] == [i.key for i in sent.mm_items]
    assert all(i.by_handle for i in by_handle.mm_items)
    assert not any(i.by_handle for i in sent.mm_items)
    with pytest.raises(MediaHandleError) as err:  # another tenant
        frontend.process(prompt(video_part(f"mmserve://{item['handle']}"), "tenant-b"))
    assert err.value.code == "media_handle_not_found"
