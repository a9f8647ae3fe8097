"""mmserve on a real local Ray Serve: two engine replicas of the tiny model behind the OpenAI
ingress (127.0.0.1, bounded CPUs), compared with a single in-thread server.

Skipped when Ray is not installed (``pip install mmserve[ray]``); CI installs the extra.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray Serve tests need the mmserve[ray] extra")
serve = pytest.importorskip("ray.serve", reason="Ray Serve tests need the mmserve[ray] extra")

from mmserve.entrypoints.listen_port import free_port  # noqa: E402
from mmserve.entrypoints.openai.server import RunningServer  # noqa: E402
from mmserve.entrypoints.ray.app import (  # noqa: E402
    app_builder,
    build_app,
    namespace_from_config,
)
from mmserve.entrypoints.ray.cluster_metrics import MIN_REFRESH_INTERVAL_S  # noqa: E402
from mmserve.entrypoints.ray.rendezvous import DEFAULT_LOAD_FACTOR as LOAD_FACTOR  # noqa: E402
from mmserve.entrypoints.ray.rendezvous import load_cap  # noqa: E402
from tests.support.images import make_image  # noqa: E402
from tests.support.video_chat import MAX_TOKENS as VIDEO_MAX_TOKENS  # noqa: E402
from tests.support.video_chat import MESSAGES as VIDEO_MESSAGES  # noqa: E402
from tests.support.video_chat import VIDEO_PRESETS, offline_answer, served_answer  # noqa: E402

MODEL = "tiny-llava"
REPLICAS = 2
SETTINGS = {"model": MODEL, "replicas": REPLICAS, "max_num_seqs": 8, "media_workers": 0}


def data_url(seed: int) -> str:
    buf = io.BytesIO()
    make_image(seed, (40, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user_turn(seeds: list[int], text: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": data_url(s)}} for s in seeds
    ]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Ray (3 CPUs, 127.0.0.1, no dashboard), Serve's proxy on a free port, the app deployed."""
    cpus = REPLICAS + 2  # the ingress, and one replica of a video app beside the main one
    ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(namespace_from_config(SETTINGS)), name="mmserve", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def single(serve_model) -> Iterator[RunningServer]:
    with serve_model(MODEL, "--max-num-seqs", "8", "--media-workers", "0") as srv:
        yield srv


def chat(base: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0, **extra}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def cluster_stats(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/cluster", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def encodes(base: str) -> int:
    return int(cluster_stats(base)["total"]["encoder_images_encoded"])


def run_conversations(base: str) -> list[str]:
    """4 chats x 3 turns, each turn adding an image; chat 3 opens with chat 0's first image
    and other text. Turns go in rounds, one request at a time. 9 distinct images."""
    firsts = {0: [0], 1: [10], 2: [20], 3: [0]}
    chats: dict[int, list[dict[str, Any]]] = {c: [] for c in firsts}
    texts = []
    for turn in range(3):
        for c, history in chats.items():
            seeds = firsts[c] if turn == 0 else [10 * c + turn + (100 if c == 3 else 0)]
            history.append(user_turn(seeds, f"chat {c} turn {turn}: what changed?"))
            answer = chat(base, history)["choices"][0]["message"]["content"]
            history.append({"role": "assistant", "content": answer})
            texts.append(answer)
    return texts


DISTINCT_IMAGES = 3 + 3 + 3 + 2  # chat 3 reuses chat 0's first image


def test_one_encode_per_distinct_image_and_same_outputs_as_one_server(
    cluster: str, single: RunningServer
) -> None:
    before = encodes(cluster)
    texts = run_conversations(cluster)
    stats = cluster_stats(cluster)
    assert encodes(cluster) - before == DISTINCT_IMAGES
    assert set(stats["replicas"]) == set(stats["routing"]["replicas"])
    assert len(stats["replicas"]) == REPLICAS
    assert stats["routing"]["decisions"].get("spill", 0) == 0  # one at a time: never over cap
    assert texts == run_conversations(single.url)


def test_streaming_and_cached_tokens_like_one_server(cluster: str, single: RunningServer) -> None:
    messages = [user_turn([7], "Describe the picture in detail.")]
    chat(cluster, messages)  # warm: the second one finds its prefix on the same replica
    full = chat(cluster, messages)
    assert full["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    streamed, usage = "", None
    with httpx.stream("POST", f"{cluster}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    for line in lines[:-1]:
        event = json.loads(line.removeprefix("data: "))
        for choice in event["choices"]:
            streamed += choice["delta"].get("content") or ""
        usage = event.get("usage") or usage
    assert streamed == full["choices"][0]["message"]["content"]
    assert usage is not None and usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert streamed == chat(single.url, messages)["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ],
                }
            ],
        },
    ],
    ids=["unknown-model", "bad-max-tokens", "bad-image"],
)
def test_errors_like_one_server(cluster: str, single: RunningServer, body: dict[str, Any]) -> None:
    mine = httpx.post(f"{cluster}/v1/chat/completions", json=body, timeout=60)
    theirs = httpx.post(f"{single.url}/v1/chat/completions", json=body, timeout=60)
    assert (mine.status_code, mine.json()) == (theirs.status_code, theirs.json())
    assert mine.status_code in (400, 404)


def test_without_a_shared_store_media_handles_are_a_clear_400_through_the_ray_ingress(
    cluster: str, single: RunningServer
) -> None:
    """Without the replicas' shared Redis store a handle would live in one replica's memory,
    out of the ingress' reach: a chat naming one, or an encode-ahead, is refused in one line
    that says what to configure (the single server answers the same chat with an unknown
    handle), and the ingress keeps serving."""
    part = {"type": "image_url", "image_url": {"url": "mmserve://" + "0" * 64}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": [part]}], "max_tokens": 2}
    mine = httpx.post(f"{cluster}/v1/chat/completions", json=body, timeout=60)
    theirs = httpx.post(f"{single.url}/v1/chat/completions", json=body, timeout=60)
    assert (mine.status_code, theirs.status_code) == (400, 400)
    assert mine.json()["error"]["code"] == "media_handle_unsupported"
    assert "--encoder-store-redis" in mine.json()["error"]["message"]
    assert theirs.json()["error"]["code"] == "media_handle_not_found"
    image = {"type": "image_url", "image_url": {"url": data_url(1)}}
    encoded = httpx.post(
        f"{cluster}/v1/mm/encode", json={"model": MODEL, "content": [image]}, timeout=60
    )
    assert encoded.status_code == 400
    assert encoded.json()["error"]["code"] == "media_handle_unsupported"
    assert chat(cluster, [user_turn([1], "Still there?")], max_tokens=2)["choices"]


BURST = 10


def test_concurrent_requests_for_one_image_spill_within_the_bound(cluster: str) -> None:
    messages = [user_turn([55], "Count the shapes.")]
    body = {"model": MODEL, "messages": messages, "max_tokens": 96, "temperature": 0}
    body["ignore_eos"] = True

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(f"{cluster}/v1/chat/completions", json=body) for _ in range(BURST)]
            return [r.status_code for r in await asyncio.gather(*calls)]

    before = cluster_stats(cluster)["routing"]
    assert asyncio.run(burst()) == [200] * BURST
    after = cluster_stats(cluster)["routing"]
    spills = after["decisions"].get("spill", 0) - before["decisions"].get("spill", 0)
    assert spills > 0, after  # all prefer one replica; the bound sends some to the other
    assert after["over_cap"] == 0
    # no replica ever held more than the cap of the whole burst in flight (stats calls: +1)
    assert max(after["peak_in_flight"].values()) <= load_cap(BURST + 1, REPLICAS, LOAD_FACTOR)
    assert sum(after["in_flight"].values()) <= REPLICAS  # only the stats calls' own, if any


def test_health_models_and_metrics(cluster: str) -> None:
    assert httpx.get(f"{cluster}/health", timeout=30).json() == {"status": "ok"}
    models = httpx.get(f"{cluster}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    text = httpx.get(f"{cluster}/metrics", timeout=30).text
    assert "mmserve_encoder_images_encoded" in text


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{base}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


ENCODED = ("mmserve_encoder_images_encoded_total", ())
AFFINITY = ("mmserve_routing_decisions_total", (("decision", "affinity"),))
SPILL = ("mmserve_routing_decisions_total", (("decision", "spill"),))


def test_a_metrics_scrape_alone_shows_fresh_encodes_and_routing(cluster: str) -> None:
    """No /cluster call: the scrape itself refreshes the replicas' sum (at most once a second)."""
    import time

    time.sleep(MIN_REFRESH_INTERVAL_S)
    before = scrape(cluster)
    chat(cluster, [user_turn([77], "What is new here?")])
    after = _wait(
        lambda: (m := scrape(cluster))[ENCODED] == before[ENCODED] + 1 and m,
        "the scrape to show the new encode",
        timeout=30,
    )
    # The chat is one keyed decision: affinity, or spill when the scrape's own stats calls (or
    # a request an earlier test left in flight) hold its replica at the load cap; stats calls
    # count as pinned.
    keyed = (after[AFFINITY] + after[SPILL]) - (before[AFFINITY] + before[SPILL])
    assert keyed == 1
    routed = [v for (n, _), v in after.items() if n == "mmserve_routing_requests_routed_total"]
    assert len(routed) == REPLICAS and sum(routed) > 0
    in_flight = [k for k in after if k[0] == "mmserve_routing_in_flight"]
    assert len(in_flight) == REPLICAS
    assert after[("mmserve_cluster_replicas_reporting", ())] == REPLICAS
    assert 0 <= after[("mmserve_cluster_stats_age_seconds", ())] < 5


@pytest.mark.parametrize("model", VIDEO_PRESETS)
def test_a_video_chat_answers_as_the_offline_api(cluster: str, model: str) -> None:
    """The ingress admits videos as a single server does (the same limits, the preset's own
    template) and a replica answers what the offline API does."""
    settings = {"model": model, "replicas": 1, "media_workers": 0}
    serve.run(build_app(namespace_from_config(settings)), name="video", route_prefix="/video")
    try:
        assert served_answer(f"{cluster}/video", model) == offline_answer(model)
    finally:
        serve.delete("video")


# ---- the shared encoder store (issue 17); last in this module: it replaces the app above ----
@pytest.fixture(scope="module")
def store_app(cluster: str, module_redis_server) -> Iterator[str]:
    """The app again, its replicas sharing one real Redis L3 (redis-server on 127.0.0.1)."""
    serve.delete("mmserve")
    settings = {
        **SETTINGS,
        "encoder_store_redis": module_redis_server.url,
        "encoder_store_secret": "ray-test-secret-0123456789",
        "encoder_store_lease_ms": 10_000,  # generous: a loaded test machine keeps its holder
        # and its lookups (a Redis read and the lease's SET NX): one later than the default
        # 50 ms counts as a miss and encodes here, which a loaded CI machine did once
        "encoder_store_timeout_ms": 5_000,
    }
    app = build_app(namespace_from_config(settings))
    serve.run(app, name="mmserve-store", route_prefix="/")
    yield cluster


def _kill_replica(replica: str) -> None:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "EngineReplica" in actor["name"] and actor["name"].endswith(replica):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            return
    raise AssertionError(f"no actor for replica {replica}")


def _wait(predicate: Any, what: str, timeout: float = 180.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def test_shared_store_a_restarted_replica_loads_instead_of_encoding(store_app: str) -> None:
    texts = run_conversations(store_app)
    first = cluster_stats(store_app)
    assert first["total"]["encoder_images_encoded"] == DISTINCT_IMAGES
    _wait(
        lambda: cluster_stats(store_app)["total"].get("encoder_store_writes", 0) >= DISTINCT_IMAGES,
        "the store's write-behind",
    )
    busiest = max(first["replicas"], key=lambda r: first["replicas"][r]["requests"])
    (survivor,) = set(first["replicas"]) - {busiest}
    _kill_replica(busiest)

    def replaced() -> dict[str, Any] | None:
        stats = cluster_stats(store_app)
        names = set(stats["replicas"])
        return stats if len(names) == REPLICAS and busiest not in names else None

    _wait(replaced, "Serve to replace the killed replica")
    assert run_conversations(store_app) == texts
    after = cluster_stats(store_app)
    # not one image encoded again anywhere: the killed replica's chats moved (to the survivor
    # or the new replica, as rendezvous ranks them) and were loaded from the store; the
    # survivor's own ones hit its cache, or the store where the new replica took them over
    encoded = sum(r["encoder_images_encoded"] for r in after["replicas"].values())
    assert encoded == first["replicas"][survivor]["encoder_images_encoded"]
    assert sum(r["encoder_store_loads"] for r in after["replicas"].values()) > 0


def test_a_burst_for_one_new_image_encodes_once_across_replicas(
    store_app: str, single: RunningServer
) -> None:
    """Issue 31: the replicas' concurrent misses elect one encoder through the store's lease;
    the other replica waits for the stored result and loads it. Whether it waited or came
    after the write depends on timing (the lease tests in tests/store check the wait)."""
    messages = [user_turn([66], "Describe it.")]
    body = {"model": MODEL, "messages": messages, "max_tokens": 48, "temperature": 0}
    body["ignore_eos"] = True

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(f"{store_app}/v1/chat/completions", json=body) for _ in range(8)]
            replies = await asyncio.gather(*calls)
        assert [r.status_code for r in replies] == [200] * 8, [r.text for r in replies]
        return [r.json()["choices"][0]["message"]["content"] for r in replies]

    before = cluster_stats(store_app)
    answers = asyncio.run(burst())
    after = cluster_stats(store_app)  # every reply is in: so is every encode
    spills = after["routing"]["decisions"].get("spill", 0)
    assert spills > before["routing"]["decisions"].get("spill", 0), after["routing"]  # both
    total, first = after["total"], before["total"]
    store = {k: v - first.get(k, 0) for k, v in total.items() if k.startswith("encoder_store_")}
    assert total["encoder_images_encoded"] - first["encoder_images_encoded"] == 1, store
    # the replica that did not encode got the embedding from the store: by waiting on the
    # lease, or, when its requests came after the write, as a plain store hit
    assert total["encoder_store_loads"] > first.get("encoder_store_loads", 0), total
    reference = chat(single.url, messages, max_tokens=48, ignore_eos=True)
    assert answers == [reference["choices"][0]["message"]["content"]] * 8


def handle_turn(handle: str, text: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": f"mmserve://{handle}"}}
    return {"role": "user", "content": [part, {"type": "text", "text": text}]}


def test_shared_store_encode_ahead_through_the_ingress_then_chat_by_handle_anywhere(
    store_app: str, single: RunningServer
) -> None:
    """With the shared store the ingress routes /v1/mm/encode to a replica by the image's key;
    the handle's record lands in Redis, so a burst of chats naming it, spread over both
    replicas, encodes nothing and answers as the image itself does; another tenant's chat
    naming it is refused as unknown."""
    image = {"type": "image_url", "image_url": {"url": data_url(88)}}
    before = cluster_stats(store_app)
    r = httpx.post(
        f"{store_app}/v1/mm/encode",
        json={"model": MODEL, "content": [image], "cache_salt": "tenant-a"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    [item] = r.json()["items"]
    encoded = cluster_stats(store_app)["total"]["encoder_images_encoded"]
    assert encoded - before["total"]["encoder_images_encoded"] == 1
    body = {"model": MODEL, "messages": [handle_turn(item["handle"], "Describe it.")]}
    body.update(max_tokens=48, temperature=0, ignore_eos=True, cache_salt="tenant-a")

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            calls = [client.post(f"{store_app}/v1/chat/completions", json=body) for _ in range(6)]
            replies = await asyncio.gather(*calls)
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        return [r.json()["choices"][0]["message"]["content"] for r in replies]

    answers = asyncio.run(burst())
    after = cluster_stats(store_app)
    assert after["total"]["encoder_images_encoded"] == encoded, after["total"]
    spills = after["routing"]["decisions"].get("spill", 0)
    assert spills > before["routing"]["decisions"].get("spill", 0), after["routing"]
    reference = chat(single.url, [user_turn([88], "Describe it.")], max_tokens=48, ignore_eos=True)
    assert answers == [reference["choices"][0]["message"]["content"]] * 6
    other = httpx.post(
        f"{store_app}/v1/chat/completions", json={**body, "cache_salt": "tenant-b"}, timeout=60
    )
    assert other.status_code == 400 and other.json()["error"]["code"] == "media_handle_not_found"


def test_shared_store_a_video_encoded_ahead_is_named_by_handle_through_the_ingress(
    store_app: str, module_redis_server
) -> None:
    """Videos too: /v1/mm/encode through the ingress encodes every piece on a replica and
    answers a video handle; a chat naming it encodes nothing and answers as the video does."""
    model = VIDEO_PRESETS[0]
    settings = {"model": model, "replicas": 1, "media_workers": 0}
    settings["encoder_store_redis"] = module_redis_server.url
    settings["encoder_store_secret"] = "ray-video-secret-0123456789"
    serve.run(build_app(namespace_from_config(settings)), name="vstore", route_prefix="/vstore")
    base = f"{store_app}/vstore"
    try:
        [video, text] = VIDEO_MESSAGES[0]["content"]
        body = {"model": model, "content": [video], "cache_salt": "tenant-v"}
        r = httpx.post(f"{base}/v1/mm/encode", json=body, timeout=120)
        assert r.status_code == 200, r.text
        [item] = r.json()["items"]
        assert item["type"] == "video" and item["tokens"] > 0
        encoded = encodes(base)
        assert encoded >= 2  # every piece of the video
        named = {"type": "video_url", "video_url": {"url": f"mmserve://{item['handle']}"}}
        messages = [{"role": "user", "content": [named, text]}]
        body = {"model": model, "messages": messages, "max_tokens": VIDEO_MAX_TOKENS}
        body.update(temperature=0, cache_salt="tenant-v")
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert encodes(base) == encoded
        reply = r.json()
        answer = reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens"]
        assert answer == offline_answer(model)
    finally:
        serve.delete("vstore")


def test_flags_reach_the_deployments_unchanged() -> None:
    """No cluster needed: the application's deployment options and replica arguments."""
    autoscaling = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 4}
    args = namespace_from_config(
        {
            **SETTINGS,
            "ray_autoscaling": autoscaling,
            "routing": "pow2",
            "routing_load_factor": 2.0,
            "kv_cache_memory": "64MiB",
        }
    )
    app = build_app(args)
    ingress = app._bound_deployment
    replica_app = ingress.init_args[0]
    replica = replica_app._bound_deployment
    engine_args, max_queued, threads = replica.init_args
    assert engine_args["model"] == MODEL and engine_args["max_num_seqs"] == 8
    assert engine_args["kv_cache_memory"] == 64 * 2**20
    assert (max_queued, threads) == (args.max_queued_requests, 1)
    config = replica._deployment_config
    assert config.autoscaling_config.max_replicas == 3
    assert config.autoscaling_config.target_ongoing_requests == 4
    kwargs = config.request_router_config.request_router_kwargs
    assert kwargs == {"load_factor": 2.0, "policy": "pow2"}
    with pytest.raises(ValueError, match="--routing-load-factor"):
        build_app(namespace_from_config({**SETTINGS, "routing_load_factor": 0.5}))


def test_config_booleans_and_the_page_default_under_serve_run() -> None:
    """``ui: false`` in a config is ``--no-ui``; ``serve run`` binds where Serve's http_options
    say, so there the page is off unless the config turns it on."""
    assert namespace_from_config({**SETTINGS, "ui": False}).ui is False
    assert namespace_from_config({**SETTINGS, "ui": True}).ui is True
    assert namespace_from_config({**SETTINGS, "public_metrics": False}).public_metrics is False
    assert app_builder(SETTINGS)._bound_deployment.init_args[1].ui is False
    assert app_builder({**SETTINGS, "ui": True})._bound_deployment.init_args[1].ui is True
