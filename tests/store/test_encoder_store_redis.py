"""The encoder store's Redis tier against a real redis-server: shared by engine processes,
and a dead or hanging Redis never costs an answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmserve import LLM, SamplingParams
from mmserve.store.redis_tier import KEY_PREFIX, RedisTier, TierUnavailable

GREEDY = SamplingParams(temperature=0, max_tokens=8)
PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"
SECRET = "shared-deployment-secret-for-tests"
ROOT = Path(__file__).resolve().parents[2]

FIRST_REPLICA = """
import json, sys
from mmserve import LLM, SamplingParams
from tests.support.images import make_image
llm = LLM("tiny-llava", encoder_store_redis=sys.argv[1], encoder_store_secret=sys.argv[2])
images = [make_image(0, (96, 80)), make_image(1, (64, 64))]
outs = llm.generate([{"prompt": sys.argv[3], "images": [i]} for i in images],
                    SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
llm.engine.close()
print(json.dumps({"encoded": llm.get_metrics()["encoder_images_encoded"],
                  "answers": [o.outputs[0].token_ids for o in outs]}))
"""


def ask(llm: LLM, images) -> list[list[int]]:
    outs = llm.generate([{"prompt": PROMPT, "images": [i]} for i in images], GREEDY, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outs]


def replica(url: str, **kw) -> LLM:
    """An engine on the shared Redis whose lookups get 5 s: one past the default 50 ms deadline
    is a miss that encodes here, and these tests count who encoded."""
    kw.setdefault("encoder_store_timeout_ms", 5_000)
    return LLM("tiny-llava", encoder_store_redis=url, encoder_store_secret=SECRET, **kw)


def test_redis_tier_writes_once_refreshes_ttl_and_opens_its_circuit(redis_server):
    tier = RedisTier(redis_server.url, ttl_s=100, timeout_s=0.5, cooldown_s=60)
    assert tier.put("k", b"first") is True
    assert tier.put("k", b"second") is False  # SET NX: the first value stays
    redis_server.client.expire(KEY_PREFIX + "k", 10)
    assert tier.get("k") == b"first"
    assert redis_server.client.ttl(KEY_PREFIX + "k") > 10  # GETEX refreshed it
    tier.delete("k")
    assert tier.get("k") is None
    redis_server.kill()
    with pytest.raises(Exception, match="(?i)connect"):
        tier.get("k")
    with pytest.raises(TierUnavailable):  # no new connection attempt during the cooldown
        tier.get("k")
    with pytest.raises(ValueError, match="encoder_store_redis"):
        RedisTier("http://127.0.0.1:1", 10, 0.1)


def test_a_second_engine_process_encodes_nothing_the_first_encoded(redis_server, images):
    done = subprocess.run(
        [sys.executable, "-c", FIRST_REPLICA, redis_server.url, SECRET, PROMPT],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["encoded"] == 2
    second = replica(redis_server.url)
    assert ask(second, images[:2]) == first["answers"] == ask(LLM("tiny-llava"), images[:2])
    metrics = second.get_metrics()
    assert metrics["encoder_images_encoded"] == 0 and metrics["encoder_store_redis_hits"] == 2
    other_secret = LLM("tiny-llava", encoder_store_redis=redis_server.url,
                       encoder_store_secret="another-deployment-secret")  # fmt: skip
    ask(other_secret, images[:1])
    metrics = other_secret.get_metrics()
    assert metrics["encoder_images_encoded"] == 1 and metrics["encoder_store_mac_failures"] == 1


def test_redis_killed_mid_run_every_request_is_answered(redis_server, images):
    plain = ask(LLM("tiny-llava"), images)
    llm = replica(redis_server.url)
    assert ask(llm, images[:2]) == plain[:2]
    llm.engine.store.flush(10)
    redis_server.kill()
    assert ask(llm, images) == plain
    metrics = llm.get_metrics()
    assert metrics["encoder_store_redis_errors"] >= 1
    assert metrics["encoder_images_encoded"] == 4  # the first two were still in the cache


def test_hanging_redis_costs_at_most_the_deadline(redis_server, images):
    plain = ask(LLM("tiny-llava"), images[:2])
    llm = replica(redis_server.url, encoder_store_timeout_ms=50)
    redis_server.pause()
    try:
        start = time.monotonic()
        assert ask(llm, images[:2]) == plain
        assert time.monotonic() - start < 30  # not a hang (the timing itself is not asserted)
        metrics = llm.get_metrics()
        assert metrics["encoder_store_late_lookups"] >= 1
        assert metrics["encoder_images_encoded"] == 2
    finally:
        redis_server.resume()
