"""Structured outputs and tools through a real server and the official ``openai`` client:
``response_format``, ``structured_outputs`` / ``guided_*``, ``tools`` with ``tool_choice``
auto / required / named (streamed too), tool turns in the history, and the 400s."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import openai
import pytest
from openai import OpenAI

from mmserve.cli import build_parser
from mmserve.entrypoints.openai.server import RunningServer, serve_in_thread

MODEL = "tiny-qwen2-vl"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Qwen2.5's Hermes tool format, reduced to its structure (the tiny preset's template has none)
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within"
    ' <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments":'
    " <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{{ message.content or '' }}{% for tc in message.tool_calls %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z]{1,10}$"},
        "mood": {"type": "string", "enum": ["happy", "sad"]},
        "adult": {"type": "boolean"},
    },
    "required": ["name", "mood", "adult"],
    "additionalProperties": False,
}
HERMES_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Rome"\}\}\n</tool_call>'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    template = tmp_path_factory.mktemp("template") / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE)
    argv = ["serve", MODEL, "--port", "0", "--uvicorn-log-level", "warning"]
    argv += ["--chat-template", str(template)]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


def chat(client: OpenAI, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=kwargs.pop("messages", MESSAGES), temperature=0, **kwargs
    )


def test_response_format_json_schema_and_json_object(client: OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = chat(client, response_format=fmt, max_tokens=200).choices[0]
    assert out.finish_reason == "stop"
    person = json.loads(out.message.content)
    assert set(person) == {"name", "mood", "adult"} and person["mood"] in ("happy", "sad")
    out = chat(client, response_format={"type": "json_object"}, max_tokens=30).choices[0]
    assert out.message.content.startswith("{")  # the random model's keys need not end in 30
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.message.content), dict)


def test_structured_outputs_and_guided_fields(client: OpenAI) -> None:
    body = {"structured_outputs": {"choice": ["sunny", "rainy"]}}
    assert chat(client, extra_body=body).choices[0].message.content in ("sunny", "rainy")
    body = {"structured_outputs": {"regex": r"[0-9]{2}C, [a-z]{3,6}"}}
    text = chat(client, extra_body=body, max_tokens=30).choices[0].message.content
    assert re.fullmatch(r"[0-9]{2}C, [a-z]{3,6}", text)
    out = chat(client, extra_body={"guided_choice": ["yes", "no"]}).choices[0].message.content
    assert out in ("yes", "no")
    comp = client.completions.create(
        model=MODEL,
        prompt="A person:",
        temperature=0,
        max_tokens=200,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
    )
    assert set(json.loads(comp.choices[0].text)) == {"name", "mood", "adult"}


def test_streamed_constrained_output_matches_the_whole_one(client: OpenAI) -> None:
    body = {"structured_outputs": {"json": PERSON}}
    whole = chat(client, extra_body=body, max_tokens=200).choices[0].message.content
    stream = chat(client, extra_body=body, max_tokens=200, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex",
         "only one output constraint"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
         "response_format", "cannot be compiled"),
        ({"structured_outputs": {"regex": "(open"}}, "structured_outputs", "cannot be compiled"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
         "exactly one"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format", "json_schema.schema"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "not in tools"),
        ({"tools": TOOLS, "tool_choice": "required", "guided_choice": ["a"]}, "tool_choice",
         "only one output constraint"),
        ({"tool_choice": "required"}, "tool_choice", "non-empty tools"),
        ({"structural_tag": {"a": 1}}, "structural_tag", "structural_tag"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400s_naming_the_field(
    client: OpenAI, extra: dict, param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=5, extra_body=extra)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and message in body["message"]


def _assembled(stream) -> tuple[str, list[tuple[str, dict]], str | None]:
    content, calls, finish = "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            if call.index == len(calls):
                assert call.id and call.function.name
                calls.append([call.function.name, ""])
            calls[call.index][1] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [(name, json.loads(args)) for name, args in calls], finish


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_named_tool_choice(client: OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = chat(client, tools=TOOLS, tool_choice=choice, max_tokens=40).choices[0]
    calls = _calls(out.message)
    assert out.finish_reason == "stop" and out.message.content is None
    assert calls[0][0] == "get_weather" and calls[0][1]["city"] in ("Paris", "Rome")
    stream = chat(client, tools=TOOLS, tool_choice=choice, max_tokens=40, stream=True)
    assert _assembled(stream) == ("", calls, "stop")


def test_required_tool_choice(client: OpenAI) -> None:
    out = chat(client, tools=TOOLS, tool_choice="required", max_tokens=300).choices[0]
    calls = _calls(out.message)
    assert out.finish_reason == "tool_calls", out.message
    assert calls and all(name in ("get_weather", "get_time") for name, _ in calls)
    stream = chat(client, tools=TOOLS, tool_choice="required", max_tokens=300, stream=True)
    assert _assembled(stream) == ("", calls, "tool_calls")


def test_auto_tool_choice_parses_hermes_calls(client: OpenAI) -> None:
    """The random tiny model never calls a tool by itself: a regex makes it write one."""
    body = {"structured_outputs": {"regex": "Checking\\.\\n" + HERMES_CALL}}
    out = chat(client, tools=TOOLS, extra_body=body, max_tokens=200).choices[0]
    assert out.finish_reason == "tool_calls"
    assert out.message.content == "Checking.\n"
    assert _calls(out.message) == [("get_weather", {"city": "Rome"})]
    stream = chat(client, tools=TOOLS, extra_body=body, max_tokens=200, stream=True)
    assert _assembled(stream) == ("Checking.\n", _calls(out.message), "tool_calls")
    plain = chat(client, tools=TOOLS, max_tokens=12).choices[0]  # no call: plain content
    assert not plain.message.tool_calls and plain.message.content
    stream = chat(client, tools=TOOLS, max_tokens=12, stream=True)
    assert _assembled(stream) == (plain.message.content, [], plain.finish_reason)


def test_tool_turns_in_the_history_render(client: OpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21C, sunny"},
    ]
    out = chat(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=5)
    assert out.usage.prompt_tokens > chat(client, max_tokens=5).usage.prompt_tokens + 20


def test_tool_calls_stream_per_choice_with_n(client: OpenAI) -> None:
    """n > 1: each choice has its own tool-call streamer (index-tagged deltas)."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
    kwargs |= {"max_tokens": 40, "n": 2, "seed": 3, "temperature": 1.0}
    whole = client.chat.completions.create(**kwargs).choices
    assert sorted(c.index for c in whole) == [0, 1]
    stream = list(client.chat.completions.create(stream=True, **kwargs))
    for c in whole:
        per_choice = [
            SimpleNamespace(choices=[x for x in chunk.choices if x.index == c.index])
            for chunk in stream
        ]
        assert _assembled(per_choice) == ("", _calls(c.message), "stop")


def test_without_xgrammar_constraints_are_400s_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """xgrammar is the ``structured`` extra: a server without it starts, answers plain chats,
    and refuses a constrained one with a 400 that says what to install."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` fails as if absent
    argv = ["serve", MODEL, "--port", "0", "--uvicorn-log-level", "warning"]
    with serve_in_thread(build_parser().parse_args(argv)) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)
        for extra in ({"response_format": {"type": "json_object"}}, {"guided_choice": ["a"]}):
            with pytest.raises(openai.BadRequestError) as info:
                chat(client, max_tokens=5, extra_body=extra)
            body = info.value.body
            assert isinstance(body, dict) and "pip install 'mmserve[structured]'" in body["message"]
        assert chat(client, max_tokens=3).choices[0].finish_reason == "length"
