"""The encode lease is renewed while its holder lives and wants it (issue 31): an encode slower
than the lease still ends in one encode and the others' load; a holder that dies, or whose
request ends before its encode, or that holds it past the renewal cap, lets it go."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import torch

from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.inputs import MultiModalItem, PromptInput
from mmserve.store.lease import LEASE_PREFIX, EncodeLease
from mmserve.store.redis_tier import RedisTier
from tests.store.test_encoder_store_lease import (
    PROMPT,
    SECRET,
    admit,
    plain_answer,
    redis_store,
    step_all,
)

# short, so that "longer than the lease" takes seconds in a test, yet a third of it (the margin
# of a renewal) above the pauses of a loaded 2-core test machine (300 ms was not)
LEASE_MS = 1000
OUTLIVE_S = 2.5 * LEASE_MS / 1000  # a simulated encode two and a half lease lifetimes long
HOLDER = """
import sys
from mmserve.store.lease import EncodeLease
from mmserve.store.redis_tier import RedisTier
lease = EncodeLease(RedisTier(sys.argv[1], 100, 0.5), int(sys.argv[2]))
assert lease.acquire("k")
print("held", flush=True)
sys.stdin.read()  # hold (and renew) until killed
"""


def lease_of(url: str, lease_ms: int = LEASE_MS, **kw) -> EncodeLease:
    return EncodeLease(RedisTier(url, 100, 0.5), lease_ms=lease_ms, **kw)


def engine_on(url: str) -> LLMEngine:
    """A replica with a short lease whose admission waits long enough for its store lookup on
    a loaded machine (a lookup later than the deadline is a miss: the waiter would encode)."""
    return LLMEngine.from_args(
        "tiny-llava", encoder_store_redis=url, encoder_store_secret=SECRET,
        encoder_store_lease_ms=LEASE_MS, encoder_store_timeout_ms=5000,
    )  # fmt: skip


def until(condition: Callable[[], bool], timeout: float = 10.0) -> float:
    """Poll ``condition`` (every 10 ms, at most ``timeout``); the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_holder_keeps_its_lease_past_its_lifetime_and_releases_it(redis_server):
    holder, other = lease_of(redis_server.url), lease_of(redis_server.url)
    assert holder.acquire("k")
    time.sleep(OUTLIVE_S)  # the holder's encode outlives the lease: its renewals keep it
    assert holder.holds("k") and not other.acquire("k")
    assert 0 < redis_server.client.pttl(LEASE_PREFIX + "k") <= LEASE_MS
    holder.release("k")
    assert not other.alive("k") and other.acquire("k")
    holder.close()
    other.close()


def test_renewals_go_around_the_tiers_open_circuit(redis_server):
    """A Redis call that timed out on a loaded machine opens the tier's circuit for seconds:
    the lookups skip Redis meanwhile, but the holder keeps renewing its lease."""
    holder = lease_of(redis_server.url)
    assert holder.acquire("k")
    holder.tier._open_until = time.monotonic() + 60  # as a failed call leaves it
    time.sleep(OUTLIVE_S)
    assert holder.holds("k") and lease_of(redis_server.url).alive("k")
    holder.tier._open_until = 0.0
    holder.close()  # gives it back
    assert not lease_of(redis_server.url).alive("k")


def test_renewals_stop_at_the_cap_and_the_lease_expires(redis_server):
    holder = lease_of(redis_server.url, max_hold_s=0.6)
    assert holder.acquire("k")
    took = until(lambda: not holder.alive("k"))
    assert 0.6 <= took <= 0.6 + LEASE_MS / 1000 + 1.0
    assert not holder.holds("k")
    holder.close()


def test_a_lost_lease_is_not_renewed_into_its_successors(redis_server):
    holder, successor = lease_of(redis_server.url), lease_of(redis_server.url)
    assert holder.acquire("k")
    redis_server.client.delete(LEASE_PREFIX + "k")  # the holder's lease ran out ...
    assert successor.acquire("k")  # ... and another took over: renewing must not extend it
    until(lambda: not holder.holds("k"), timeout=2 * LEASE_MS / 1000 + 1.0)
    successor.release("k")
    assert not successor.alive("k")
    holder.close()
    successor.close()


def test_a_killed_holder_stops_renewing_and_a_waiter_takes_over(redis_server):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_server.url, str(LEASE_MS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        time.sleep(OUTLIVE_S)  # alive: the other process renews it
        assert lease_of(redis_server.url).alive("k")
    finally:
        proc.kill()
        proc.wait(10)
    took = until(lambda: not lease_of(redis_server.url).alive("k"))
    assert took <= LEASE_MS / 1000 + 1.0  # dead: expired within one lifetime (and a poll)
    waiter = lease_of(redis_server.url)
    assert waiter.acquire("k")
    waiter.close()


def test_an_encode_slower_than_the_lease_is_waited_for_and_loaded(redis_server):
    holder, waiter = (
        redis_store(redis_server.url, LEASE_MS),
        redis_store(redis_server.url, LEASE_MS),
    )
    item = MultiModalItem(hash="cd" * 32, offset=0, length=4)
    emb = torch.randn(4, 8)
    first = holder.lookup([item])
    first.wait(5)
    assert first.hits() == {} and first.waits() == {}  # elected: it encodes
    second = waiter.lookup([item])
    second.wait(5)
    pending = second.waits()[item.key]
    time.sleep(OUTLIVE_S)  # the holder's slow encode
    assert not pending.done() and waiter.metrics.get("lease_takeovers") == 0
    holder.encoded(item.key, emb)
    assert torch.equal(pending.result(timeout=10), emb)
    assert waiter.metrics.get("lease_loaded") == 1 and waiter.metrics.get("lease_takeovers") == 0
    holder.close()
    waiter.close()


def test_replicas_encode_once_when_the_encode_outlives_the_lease(redis_server, images):
    plain = plain_answer(images[0])
    holder = engine_on(redis_server.url)
    waiter = engine_on(redis_server.url)
    encode = holder.model.encode_images

    def slow_encode(images_: list) -> list[torch.Tensor]:
        time.sleep(OUTLIVE_S)  # a real-size ViT on a CPU
        return encode(images_)

    holder.model.encode_images = slow_encode  # type: ignore[method-assign]
    held = admit(holder, images[0])
    waiting = admit(waiter, images[0])
    assert step_all(holder)[held] == plain
    assert step_all(waiter)[waiting] == plain
    h, w = holder.get_metrics(), waiter.get_metrics()
    assert h["encoder_images_encoded"] == 1 and w["encoder_images_encoded"] == 0
    assert w["encoder_images_loaded"] == 1 and w["encoder_store_lease_takeovers"] == 0
    holder.close()
    waiter.close()


def test_a_request_that_ends_before_its_encode_gives_the_lease_back(redis_server, images):
    holder = engine_on(redis_server.url)
    key = holder.front.processor.process(PromptInput(PROMPT, [images[0]])).mm_items[0].key
    skey = holder.store.keyer.key(key)
    held = admit(holder, images[0])  # queued, not stepped: its lease is renewed meanwhile
    time.sleep(OUTLIVE_S)
    assert holder.store.lease.alive(skey) and holder.store.lease.holds(skey)
    holder.abort_request([held])  # the client went away before the encode
    until(lambda: not holder.store.lease.alive(skey), timeout=5)
    assert holder.get_metrics()["encoder_images_encoded"] == 0
    holder.close()
