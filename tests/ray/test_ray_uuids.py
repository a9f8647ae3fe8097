"""vLLM's uuid shape through the Ray ingress: an ordinary chat that sends an image with a
``uuid`` registers it in the replicas' shared Redis store, as a single server registers it in
its own, so a later chat (through any ingress, on either replica) may send the uuid alone, in
the same tenant; until the image's embedding is in a tier, naming it is the "send the image
again" 400, never a wrong answer.

The first tests need no Ray (``FrontendEngine`` and engines sharing one Redis); the last one
runs the application on a real local Ray Serve with two replicas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mmserve import LLM
from mmserve.entrypoints.chat_utils import chat_to_prompt
from mmserve.entrypoints.ray.frontend import FrontendEngine
from mmserve.inputs import PromptInput
from mmserve.multimodal.handles import MediaHandleError
from tests.engine.handles.test_encode_handles import chat_of, data_url, image_part
from tests.ray.test_ray_handles import MODEL, SECRET, frontend_of


def bare(uuid: str) -> dict[str, Any]:
    """vLLM's shape: an image part with the uuid and no image."""
    return {"type": "image_url", "uuid": uuid}


def prompt_of(frontend: FrontendEngine, part: dict, salt: str | None) -> PromptInput:
    return chat_to_prompt(frontend.tokenizer, chat_of(part), salt, frontend.chat_template)


def store_of(redis: Any) -> dict[str, Any]:
    # lookups get 5 s: one past the default 50 ms deadline is a miss that encodes here, and
    # these tests count who encoded
    return {
        "encoder_store_redis": redis.url,
        "encoder_store_secret": SECRET,
        "encoder_store_timeout_ms": 5_000,
    }


@pytest.fixture(scope="module")
def replicas(module_redis_server) -> tuple[LLM, LLM]:
    """Two engines sharing one Redis, as two Ray replicas do."""
    store = store_of(module_redis_server)
    return LLM(MODEL, **store), LLM(MODEL, **store)


@pytest.fixture
def ingresses(replicas, module_redis_server) -> Iterator[tuple[FrontendEngine, FrontendEngine]]:
    """Two ingresses' admission (records in memory, and in the shared Redis)."""
    store = store_of(module_redis_server)
    first, second = frontend_of(replicas[0], **store), frontend_of(replicas[0], **store)
    yield first, second
    first.close()
    second.close()


def test_a_chat_through_the_ingress_registers_its_uuid_for_every_ingress(ingresses) -> None:
    first, second = ingresses
    sent = first.process(prompt_of(first, image_part(data_url(31), uuid="u31"), "tenant-a"))
    assert first.handles is not None and first.handles.store is not None
    assert first.handles.store.flush(10)  # the record's write-behind
    for ingress in (first, second):  # the one that admitted it, and one reading only Redis
        named = ingress.process(prompt_of(ingress, bare("u31"), "tenant-a"))
        assert named.prompt_token_ids == sent.prompt_token_ids
        [by_uuid], [plain] = named.mm_items, sent.mm_items
        assert by_uuid.key == plain.key and by_uuid.by_handle and not plain.by_handle
        for salt in ("tenant-b", None):
            with pytest.raises(MediaHandleError) as err:
                ingress.process(prompt_of(ingress, bare("u31"), salt))
            assert err.value.code == "media_handle_not_found"


def test_before_the_encode_lands_a_replica_asks_for_the_image_again(replicas, ingresses) -> None:
    """What a replica does with a chat naming the uuid (``HandleBook.embeddings``): with no
    embedding in its cache or the store yet, "expired" (the 400 asking for the image again);
    once one replica encoded the image and the store has it, the other loads it."""
    (encoder, other), (first, second) = replicas, ingresses
    part = image_part(data_url(32), uuid="u32")
    first.process(prompt_of(first, part, "tenant-a"))
    assert first.handles is not None and first.handles.store is not None
    assert first.handles.store.flush(10)
    named = second.process(prompt_of(second, bare("u32"), "tenant-a"))
    used = {item.hash.split("#", 1)[0] for item in named.mm_items}
    for replica in (encoder, other):
        with pytest.raises(MediaHandleError) as err:
            replica.engine.handles.embeddings(named, used)
        assert err.value.code == "media_handle_expired"
        assert "send the image again" in str(err.value)
    encoder.chat(chat_of(part), cache_salt="tenant-a")  # the first chat's step, on a replica
    assert encoder.engine.store is not None and encoder.engine.store.flush(10)
    for replica in (encoder, other):
        assert set(replica.engine.handles.embeddings(named, used)) == {named.mm_items[0].key}


# ---- through a real local Ray Serve ------------------------------------------------------
@pytest.fixture(scope="module")
def ray_app(module_redis_server) -> Iterator[str]:
    """Ray (3 CPUs, 127.0.0.1, no dashboard), Serve's proxy on a free port, two replicas of
    the tiny model sharing the module's Redis."""
    ray = pytest.importorskip("ray", reason="Ray Serve tests need the mmserve[ray] extra")
    serve = pytest.importorskip("ray.serve", reason="Ray Serve tests need the mmserve[ray] extra")
    from mmserve.entrypoints.listen_port import free_port
    from mmserve.entrypoints.ray.app import build_app, namespace_from_config

    settings = {"model": MODEL, "replicas": 2, "max_num_seqs": 8, "media_workers": 0}
    settings.update(store_of(module_redis_server), encoder_store_lease_ms=10_000)
    ray.init(num_cpus=3, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(namespace_from_config(settings)), name="uuids", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def cluster_total(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/cluster", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_through_ray_a_chat_registers_its_uuid_and_chats_name_it_on_either_replica(
    ray_app: str,
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 48, "temperature": 0}
    body.update(ignore_eos=True, cache_salt="tenant-a")
    sent = {**body, "messages": chat_of(image_part(data_url(33), uuid="u33"))}
    r = httpx.post(f"{ray_app}/v1/chat/completions", json=sent, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    deadline = time.monotonic() + 60  # the encoding replica's write to Redis (write-behind)
    while cluster_total(ray_app)["total"].get("encoder_store_writes", 0) < 1:
        assert time.monotonic() < deadline, "the store's write-behind"
        time.sleep(0.5)
    before = cluster_total(ray_app)
    named = {**body, "messages": chat_of(bare("u33"))}

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(f"{ray_app}/v1/chat/completions", json=named) for _ in range(6)]
            replies = await asyncio.gather(*calls)
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        return [r.json()["choices"][0]["message"]["content"] for r in replies]

    assert asyncio.run(burst()) == [answer] * 6
    after = cluster_total(ray_app)
    encoded = "encoder_images_encoded"
    assert after["total"][encoded] == before["total"][encoded], after["total"]  # 0 encodes
    spills = after["routing"]["decisions"].get("spill", 0)
    assert spills > before["routing"]["decisions"].get("spill", 0), after["routing"]  # both
    other = httpx.post(
        f"{ray_app}/v1/chat/completions", json={**named, "cache_salt": "tenant-b"}, timeout=60
    )
    assert other.status_code == 400 and other.json()["error"]["code"] == "media_handle_not_found"
