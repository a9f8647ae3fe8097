"""tools / tool_choice without a server: validation, the schema each choice constrains to, the
Hermes parser, and the streamed deltas (fed in every split) adding up to the parsed calls."""

from __future__ import annotations

import json

import pytest

from mmserve.entrypoints.openai.completions.tool_calls import ChatTool, NamedToolChoice, ToolMode

TOOLS = [
    ChatTool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ),
    ChatTool.model_validate({"type": "function", "function": {"name": "now"}}),
]
AUTO_OUTPUT = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
)

REQUIRED_OUTPUT = (
    '[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "R"}}]'
)


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def test_modes_and_their_validation() -> None:
    assert ToolMode.of(None, None).choice == "none"
    assert ToolMode.of(TOOLS, None).choice == "auto"
    assert ToolMode.of([], "auto").choice == "none"
    assert ToolMode.of(TOOLS, named("now")).name == "now"
    with pytest.raises(ValueError, match="'missing', which is not in tools"):
        ToolMode.of(TOOLS, named("missing"))
    with pytest.raises(ValueError, match="required"):
        ToolMode.of(None, "required")


def test_schemas_of_required_and_named() -> None:
    assert ToolMode.of(TOOLS, "auto").schema() is None
    assert ToolMode.of(TOOLS, named("get_weather")).schema() == TOOLS[0].function.parameters
    required = ToolMode.of(TOOLS, "required").schema()
    assert required is not None and required["minItems"] == 1 and "maxItems" not in required
    names = [item["properties"]["name"]["enum"] for item in required["items"]["anyOf"]]
    assert names == [["get_weather"], ["now"]]
    assert ToolMode.of(TOOLS, "required", parallel_tool_calls=False).schema()["maxItems"] == 1


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_parse() -> None:
    mode = ToolMode.of(TOOLS, "auto")
    content, calls = mode.parse(AUTO_OUTPUT)
    assert content == "Let me check.\n"
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("now", {})]
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in calls)
    assert mode.parse("just text") == ("just text", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert mode.parse(broken) == (broken, [])  # as vLLM: the whole output is content
    unclosed = '<tool_call>\n{"name": "now", "arguments": {}}'  # stopped at the EOS
    assert _calls(mode.parse(unclosed)[1]) == [("now", {})]
    assert len(ToolMode.of(TOOLS, "auto", parallel_tool_calls=False).parse(AUTO_OUTPUT)[1]) == 1


def test_required_and_named_parse() -> None:
    out = REQUIRED_OUTPUT
    assert _calls(ToolMode.of(TOOLS, "required").parse(out)[1]) == [
        ("now", {}),
        ("get_weather", {"city": "R"}),
    ]
    content, calls = ToolMode.of(TOOLS, named("get_weather")).parse('{"city": "Rome"}')
    assert content is None and _calls(calls) == [("get_weather", {"city": "Rome"})]
    assert ToolMode.of(TOOLS, "required").finish_reason("stop", True) == "tool_calls"
    assert ToolMode.of(TOOLS, named("now")).finish_reason("stop", True) == "stop"
    assert ToolMode.of(TOOLS, "auto").finish_reason("length", True) == "length"


def _stream(mode: ToolMode, text: str, step: int) -> tuple[str, list[dict]]:
    """Feed cumulative prefixes ``step`` characters apart; merge the deltas like a client."""
    streamer, content, calls = mode.streamer(), "", []
    cuts = list(range(step, len(text), step)) + [len(text)]
    for cut in cuts:
        delta = streamer.feed(text[:cut], cut == len(text))
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            if call["index"] == len(calls):
                calls.append({"name": call["function"]["name"], "arguments": ""})
            calls[call["index"]]["arguments"] += call["function"]["arguments"]
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls]


@pytest.mark.parametrize("step", [1, 2, 5, 13, 1000])
def test_streamed_calls_add_up_to_the_parsed_ones(step: int) -> None:
    auto = ToolMode.of(TOOLS, "auto")
    expected = ("Let me check.\n", _calls(auto.parse(AUTO_OUTPUT)[1]))
    assert _stream(auto, AUTO_OUTPUT, step) == expected
    assert _stream(auto, "no <tool call here", step) == ("no <tool call here", [])
    required = ToolMode.of(TOOLS, "required")
    out = REQUIRED_OUTPUT
    assert _stream(required, out, step) == ("", _calls(required.parse(out)[1]))
    mode = ToolMode.of(TOOLS, named("get_weather"))
    assert _stream(mode, '{"city": "Rome"}', step) == ("", [("get_weather", {"city": "Rome"})])


def test_streamed_required_call_is_sent_once_its_object_closes() -> None:
    streamer = ToolMode.of(TOOLS, "required").streamer()
    assert streamer.feed('[{"name": "now", "parameters": {', False) == {}
    delta = streamer.feed('[{"name": "now", "parameters": {}}', False)
    assert [c["function"]["name"] for c in delta["tool_calls"]] == ["now"]
    assert streamer.called
