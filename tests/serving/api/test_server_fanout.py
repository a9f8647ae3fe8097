"""``n > 1`` and ``prompt_logprobs`` through a real server and the official ``openai`` client:
n indexed choices (streaming too), usage counting the prompt once, one encoder run for an
n = 3 image request, a disconnect aborting every child, prompt logprobs in vLLM's shape."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from mmserve import LLM, SamplingParams
from mmserve.entrypoints.openai.server import RunningServer
from tests.support.server import image_messages, openai_client

MODEL = "tiny-llava"
TEXT = [{"role": "user", "content": "Tell me a story about a red cube."}]


@pytest.fixture(scope="module")
def server(serve_model) -> Iterator[RunningServer]:
    with serve_model(MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return openai_client(server)


def _wait_idle(server: RunningServer, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.engine.get_metrics()
        idle = m["kv_blocks_used"] == 0 and m["num_requests_running"] == 0
        if (idle and m["num_requests_waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_chat_n3_with_an_image_encodes_once_and_counts_the_prompt_once(client, server):
    before = server.engine.get_metrics()
    messages = image_messages(3)
    one = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0
    )
    many = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, n=3
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert all(c.message.content == one.choices[0].message.content for c in many.choices)
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    assert many.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens
    after = _wait_idle(server)
    assert after["encoder_images_encoded"] - before["encoder_images_encoded"] == 1


def test_completions_n_streams_each_choice_with_its_index(client):
    kwargs = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 10, "seed": 5}
    full = client.completions.create(n=2, temperature=1.0, **kwargs)
    texts, finishes = {0: "", 1: ""}, {}
    stream = client.completions.create(
        n=2, temperature=1.0, stream=True, stream_options={"include_usage": True}, **kwargs
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in full.choices}
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 20
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_chat_n_stream_sends_a_role_chunk_per_choice(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=TEXT, max_tokens=4, temperature=0, n=2, stream=True
    )
    roles, contents = [], {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.index)
            contents[choice.index] += choice.delta.content or ""
    assert sorted(roles) == [0, 1]
    assert contents[0] == contents[1] and contents[0]


def test_best_of_equal_to_n_is_accepted_and_n_beyond_max_num_seqs_is_refused(client):
    out = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=2, n=2, extra_body={"best_of": 2}
    )
    assert len(out.choices) == 2
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=100000)
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=0)
    assert info.value.body["param"] == "n"


def test_disconnect_mid_stream_aborts_every_child(server):
    body = {
        "model": MODEL,
        "messages": TEXT,
        "max_tokens": 3000,
        "ignore_eos": True,
        "n": 3,
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            assert server.engine.get_metrics()["num_requests_running"] > 0
    after = _wait_idle(server)
    assert after["kv_blocks_used"] == 0 and after["num_requests_running"] == 0
    assert not server.engine.engine.scheduler.requests
    assert not server.engine.engine.fanout.parents


def test_prompt_logprobs_in_vllms_shape(client, server):
    tokenizer = server.engine.tokenizer
    llm = LLM(MODEL)
    prompt = "Once upon a time there was"
    expected = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False
    )[0]
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    lps = out.choices[0].model_extra["prompt_logprobs"]
    assert lps[0] is None and len(lps) == len(expected.prompt_token_ids)
    for position, want in zip(lps[1:], expected.prompt_logprobs, strict=True):
        entry = position[str(want.token_id)]
        assert entry["logprob"] == pytest.approx(want.logprob, abs=1e-5)
        assert entry["rank"] == want.rank
        assert entry["decoded_token"] == tokenizer.decode([want.token_id])
        for rank, (token_id, value) in enumerate(want.top, start=1):
            assert position[str(token_id)]["logprob"] == pytest.approx(value, abs=1e-5)
            if token_id != want.token_id:
                assert position[str(token_id)]["rank"] == rank
    chat = client.chat.completions.create(
        model=MODEL, messages=TEXT, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    chat_lps = chat.model_extra["prompt_logprobs"]
    assert chat_lps[0] is None and len(chat_lps) == chat.usage.prompt_tokens
    assert all(len(p) == 1 for p in chat_lps[1:])
    assert chat.usage.prompt_tokens_details.cached_tokens == 0
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}
        )
    assert info.value.body["param"] == "prompt_logprobs"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_body={"prompt_logprobs": 21}
        )
    assert info.value.body["param"] == "prompt_logprobs"
