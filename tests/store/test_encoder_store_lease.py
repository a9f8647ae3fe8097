"""One encode per image across replicas (issue 31): stores sharing Redis elect one encoder per
missed item through a short lease; the others wait for its stored result without stalling
their step loop, a dead holder's lease expires into a takeover, and no Redis means encoding
locally as before."""

from __future__ import annotations

import torch

from mmserve import SamplingParams
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import MultiModalItem, PromptInput
from mmserve.store.codec import StoreCodec
from mmserve.store.keys import StoreKeyer
from mmserve.store.lease import LEASE_PREFIX, EncodeLease
from mmserve.store.redis_tier import RedisTier
from mmserve.store.store import EncoderStore
from tests.support.engine import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"
SECRET = "shared-deployment-secret-for-tests"
LONG_LEASE_MS = 60_000  # a holder that never finishes within a test


# ---- the store as a library ------------------------------------------------------------------
def redis_store(url: str, lease_ms: int = LONG_LEASE_MS) -> EncoderStore:
    tier = RedisTier(url, ttl_s=100, timeout_s=0.5)
    return EncoderStore(
        StoreKeyer("fp", "float32"), StoreCodec(SECRET.encode(), torch.float32), None, [tier],
        lease_ms=lease_ms,
    )  # fmt: skip


def test_lease_is_one_holder_at_a_time_and_only_its_holder_releases_it(redis_server):
    first = EncodeLease(RedisTier(redis_server.url, 100, 0.5), lease_ms=LONG_LEASE_MS)
    second = EncodeLease(RedisTier(redis_server.url, 100, 0.5), lease_ms=LONG_LEASE_MS)
    assert first.acquire("k") and first.holds("k") and second.alive("k")
    assert not second.acquire("k") and not second.holds("k")
    assert 0 < redis_server.client.pttl(LEASE_PREFIX + "k") <= LONG_LEASE_MS
    redis_server.client.delete(LEASE_PREFIX + "k")  # first's lease expired ...
    assert second.acquire("k")  # ... and second took over
    first.release("k")  # a late release by the old holder leaves the new holder's lease alone
    assert second.alive("k") and not first.holds("k")
    second.release("k")
    assert not first.alive("k")


def test_a_miss_elects_one_store_the_other_waits_and_gets_the_stored_result(redis_server):
    holder, waiter = redis_store(redis_server.url), redis_store(redis_server.url)
    item = MultiModalItem(hash="ab" * 32, offset=0, length=4)
    emb = torch.randn(4, 8)
    first = holder.lookup([item])
    first.wait(5)
    assert first.hits() == {} and first.waits() == {}  # a plain miss: this store encodes it
    second = waiter.lookup([item])
    second.wait(5)
    assert second.hits() == {} and set(second.waits()) == {item.key}
    pending = second.waits()[item.key]
    assert not pending.done()
    holder.encoded(item.key, emb)  # written behind, then the lease is released
    assert torch.equal(pending.result(timeout=10), emb)
    assert not EncodeLease(holder.tiers[0], LONG_LEASE_MS).alive(holder.keyer.key(item.key))
    assert holder.metrics.get("lease_acquired") == 1
    assert waiter.metrics.get("lease_waits") == 1 and waiter.metrics.get("lease_loaded") == 1
    again = redis_store(redis_server.url).lookup([item])  # later: a plain store hit
    again.wait(5)
    assert set(again.hits()) == {item.key} and again.waits() == {}


# ---- engines -----------------------------------------------------------------------------------
def replica(url: str, **kw) -> LLMEngine:
    """An engine on the shared Redis store whose own leases outlive any step of a loaded
    machine (the default 2 s can run out while a busy holder encodes: the waiter then takes
    over, correctly, but these tests count who encoded)."""
    kw.setdefault("encoder_store_lease_ms", LONG_LEASE_MS)
    # and whose lookups (a Redis read, then the lease's SET NX) outlive one too: a lookup past
    # the default 50 ms deadline is a miss that encodes here (a CI run saw the waiter do so)
    kw.setdefault("encoder_store_timeout_ms", 5_000)
    return LLMEngine.from_args(
        "tiny-llava", encoder_store_redis=url, encoder_store_secret=SECRET, **kw
    )


def admit(engine: LLMEngine, image, prompt: str = PROMPT) -> str:
    processed = engine.intake.process(PromptInput(prompt, [image]))
    engine.intake.wait_for_store([processed])
    return engine.intake.add_processed(processed, GREEDY)


def step_all(engine: LLMEngine, until: str | None = None) -> dict[str, list[int]]:
    """Step until every request ended (or ``until`` did); the finished ones' tokens."""
    done: dict[str, list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests() or (until is not None and until in done):
            return done
        for out in engine.step():
            if out.finished:
                assert out.outputs[0].finish_reason != "error", out
                done[out.request_id] = out.outputs[0].token_ids
    raise AssertionError("the engine did not finish")


def step_all_one(engine: LLMEngine, image) -> list[int]:
    req = admit(engine, image)
    return step_all(engine)[req]


def plain_answer(image) -> list[int]:
    return step_all_one(LLMEngine.from_args("tiny-llava"), image)


def test_two_engines_sharing_redis_encode_once_and_the_waiter_loads(redis_server, images):
    plain = plain_answer(images[0])
    holder, waiter = replica(redis_server.url), replica(redis_server.url)
    held = admit(holder, images[0])  # its lookup misses everywhere: it takes the lease
    waiting = admit(waiter, images[0])  # its lookup sees the lease: it waits for the result
    for _ in range(5):  # held back, not scheduled for the image, not failed, not encoded
        assert waiter.step() == []
    assert waiter.has_unfinished_requests()
    assert waiter.get_metrics()["encoder_images_encoded"] == 0
    assert step_all(holder)[held] == plain
    assert step_all(waiter)[waiting] == plain
    h, w = holder.get_metrics(), waiter.get_metrics()
    assert h["encoder_images_encoded"] == 1 and h["encoder_store_lease_acquired"] == 1
    assert w["encoder_images_encoded"] == 0 and w["encoder_images_loaded"] == 1
    assert w["encoder_store_lease_waits"] == 1 and w["encoder_store_lease_loaded"] == 1
    assert w["encoder_store_loads"] == 1
    assert_no_leaks(waiter)


def test_a_dead_holder_never_blocks_the_waiter_takes_over_after_expiry(redis_server, images):
    plain = plain_answer(images[0])
    other_plain = plain_answer(images[1])
    waiter = replica(redis_server.url, stall_steps=2)  # waiting steps are not stall steps
    key = waiter.front.processor.process(PromptInput(PROMPT, [images[0]])).mm_items[0].key
    lease = LEASE_PREFIX + waiter.store.keyer.key(key)
    redis_server.client.set(lease, b"a-holder-that-died", px=LONG_LEASE_MS)
    waiting = admit(waiter, images[0])
    other = admit(waiter, images[1])  # another request progresses meanwhile
    done = step_all(waiter, until=other)
    assert done == {other: other_plain} and waiter.has_unfinished_requests()
    assert waiter.get_metrics()["encoder_images_encoded"] == 1  # the other request's image
    for _ in range(5):
        assert waiter.step() == []
    redis_server.client.pexpire(lease, 100)  # the dead holder's lease runs out
    assert step_all(waiter)[waiting] == plain
    metrics = waiter.get_metrics()
    assert metrics["encoder_images_encoded"] == 2 and metrics["encoder_store_lease_takeovers"] == 1
    assert metrics["encoder_store_lease_loaded"] == 0
    assert_no_leaks(waiter)


def test_redis_unavailable_encodes_locally_without_errors(images):
    from mmserve.entrypoints.listen_port import free_port

    plain = plain_answer(images[0])
    engine = replica(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    assert step_all_one(engine, images[0]) == plain
    metrics = engine.get_metrics()
    assert metrics["encoder_images_encoded"] == 1 and metrics["encoder_store_redis_errors"] >= 1
    assert metrics["encoder_store_lease_waits"] == 0
