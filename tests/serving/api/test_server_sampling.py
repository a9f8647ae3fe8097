"""The sampling request surface through a real server and the official ``openai`` client:
refused fields are 400s naming them, penalties / min_tokens / logit_bias act, logprobs come
in OpenAI's shapes (streaming too) with the engine's values."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from mmserve import LLM, SamplingParams
from mmserve.entrypoints.openai.completions.protocol import ChatCompletionRequest, CompletionRequest
from mmserve.entrypoints.openai.completions.request_fields import REFUSED_CHAT, REFUSED_COMPLETION
from mmserve.entrypoints.openai.server import RunningServer
from tests.support.server import openai_client

MODEL = "tiny-llava"
MESSAGES = [{"role": "user", "content": "Tell me a story about a red cube."}]


@pytest.fixture(scope="module")
def server(serve_model) -> Iterator[RunningServer]:
    with serve_model(MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL)


REFUSED_CASES = [
    ("chat", "structural_tag", {"type": "structural_tag"}),
    ("chat", "functions", [{"name": "f"}]),
    ("chat", "use_beam_search", True),
    ("chat", "guided_whitespace_pattern", "[ ]*"),
    ("chat", "mm_processor_kwargs", {"max_pixels": 1000}),
    ("chat", "chat_template", "{{ messages }}"),
    ("completion", "echo", True),
    ("completion", "suffix", "end"),
    ("completion", "best_of", 3),
    ("completion", "include_stop_str_in_output", True),
]


@pytest.mark.parametrize(("kind", "field", "value"), REFUSED_CASES)
def test_refused_fields_are_400s_naming_them(client: OpenAI, kind, field, value) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={field: value}
            )
        else:
            client.completions.create(
                model=MODEL, prompt="hi", max_tokens=2, extra_body={field: value}
            )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == field and field in body["message"]


def test_neutral_values_of_refused_fields_pass(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 2,
        "logprobs": False,
        "response_format": {"type": "text"},
        "tool_choice": "none",
        "echo": False,
        "use_beam_search": False,
        "skip_special_tokens": True,
        "best_of": 1,
        "user": "someone",
    }
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text


def test_every_vllm_field_is_implemented_or_refused() -> None:
    """vLLM's chat / completions request fields (vllm/entrypoints/openai/protocol.py)."""
    common = {
        "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "seed", "stop", "stream", "stream_options", "temperature", "top_p",
        "user", "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty",
        "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
        "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
        "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids", "response_format",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "guided_decoding_backend", "guided_whitespace_pattern", "priority", "request_id",
        "logits_processors", "return_tokens_as_token_ids", "cache_salt", "kv_transfer_params",
        "vllm_xargs", "add_special_tokens", "echo",
    }  # fmt: skip
    chat = common | {
        "messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
        "reasoning_effort", "include_reasoning", "parallel_tool_calls", "bad_words",
        "add_generation_prompt", "continue_final_message", "documents", "chat_template",
        "chat_template_kwargs", "mm_processor_kwargs", "structural_tag",
    }  # fmt: skip
    completion = common | {"prompt", "suffix", "prompt_embeds"}
    for fields, model, refused in (
        (chat, ChatCompletionRequest, REFUSED_CHAT),
        (completion, CompletionRequest, REFUSED_COMPLETION),
    ):
        declared = set(model.model_fields)
        assert not declared & set(refused)
        missing = fields - declared - set(refused) - {"best_of"}
        assert not missing, missing


def test_penalties_min_tokens_and_logit_bias_act(client: OpenAI, llm: LLM) -> None:
    kwargs = {"temperature": 0, "max_tokens": 12}
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, **kwargs)
    extra = {"repetition_penalty": 0.3, "min_tokens": 12, "min_p": 0.1}
    penal = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, presence_penalty=1.0, extra_body=extra, **kwargs
    )
    params = SamplingParams(
        temperature=0, max_tokens=12, repetition_penalty=0.3, min_tokens=12, presence_penalty=1
    )
    ref = llm.chat(MESSAGES, params, use_tqdm=False)[0].outputs[0]
    assert penal.choices[0].message.content == ref.text != plain.choices[0].message.content
    assert penal.usage is not None and penal.usage.completion_tokens == 12
    forced = llm.generate("hi", SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    avoid = forced[0].outputs[0].token_ids[0]
    biased = client.completions.create(
        model=MODEL, prompt="hi", temperature=0, max_tokens=1, logit_bias={str(avoid): -100}
    )
    assert biased.choices[0].text != forced[0].outputs[0].text


def test_logit_bias_out_of_vocabulary_is_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", logit_bias={"99999999": 1})
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "logit_bias"


def test_chat_logprobs_shape_and_values(client: OpenAI, llm: LLM) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    ref = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=5, logprobs=3))[0]
    content = resp.choices[0].logprobs.content
    assert content is not None and len(content) == 5
    for entry, lp in zip(content, ref.outputs[0].logprobs or [], strict=True):
        assert entry.logprob == pytest.approx(lp.logprob, abs=1e-5)
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert bytes(entry.bytes or []).decode() == entry.token
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True,
        top_logprobs=3, stream=True,
    )  # fmt: skip
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or []]  # fmt: skip
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_completion_logprobs_shape(client: OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL, prompt="USER: hi ASSISTANT:", temperature=0, max_tokens=4, logprobs=2
    )
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.tokens and len(lp.tokens) == 4
    assert "".join(lp.tokens) == resp.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert lp.top_logprobs is not None
    for token, value, top in zip(lp.tokens, lp.token_logprobs or [], lp.top_logprobs, strict=True):
        assert top[token] == value and 2 <= len(top) <= 3


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_back_stop_strings(client: OpenAI, llm: LLM, stream: bool) -> None:
    """Streaming or not, a stop string is not looked for until min_tokens tokens exist: the
    server answers what the offline API does, and more than the stop string alone allows."""
    first = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    stop = first[0].outputs[0].text.split()[-1]
    params = SamplingParams(temperature=0, max_tokens=30, min_tokens=12, stop=[stop])
    ref = llm.chat(MESSAGES, params, use_tqdm=False)[0].outputs[0]
    assert len(ref.token_ids) > 12
    kwargs = {"temperature": 0, "max_tokens": 30, "stop": [stop], "extra_body": {"min_tokens": 12}}
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, **kwargs
        )
        pieces = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in chunks]
        text = "".join(p for p, _ in pieces)
        finish = [f for _, f in pieces if f][-1]
    else:
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, **kwargs)
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert (text, finish) == (ref.text, ref.finish_reason)
