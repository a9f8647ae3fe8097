"""``tools`` / ``tool_choice``: the output constraint each choice implies, and the model's
output parsed into OpenAI ``tool_calls`` (whole or streamed).

- ``none``: no parsing. ``auto``: the Hermes format that Qwen's templates teach,
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (any number of blocks; text
  before the first block is the message content). As with vLLM, a block that is not valid JSON
  makes the whole output plain content (non-streamed); streamed, that block is sent as content.
- ``required``: output constrained to a JSON array of ``{"name", "parameters"}`` objects, one
  of the tools each (vLLM's schema); streamed, each call is sent once its object closes.
- named (``{"type": "function", "function": {"name": ...}}``): output constrained to that
  function's ``parameters`` schema; it is the call's ``arguments``, streamed as it comes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"


class FunctionDefinition(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def _call(name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _parameters(tool: ChatTool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


@dataclass
class ToolMode:
    """What one request's ``tools`` + ``tool_choice`` mean for generation and parsing."""

    choice: Literal["none", "auto", "required", "named"]
    tools: list[ChatTool] = field(default_factory=list)
    name: str | None = None  # the named function
    parallel: bool = True  # parallel_tool_calls: false keeps only the first call

    @classmethod
    def of(
        cls,
        tools: list[ChatTool] | None,
        choice: ToolChoice | None,
        parallel_tool_calls: bool | None = None,
    ) -> ToolMode:
        """Validated mode; a bad combination is a ValueError naming the field."""
        parallel = parallel_tool_calls is not False
        tools = list(tools or [])
        if choice is None:
            choice = "auto" if tools else "none"
        if isinstance(choice, NamedToolChoice):
            names = [t.function.name for t in tools]
            if choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names function {choice.function.name!r}, which is not in"
                    f" tools ({', '.join(names) or 'none given'})"
                )
            return cls("named", tools, choice.function.name, parallel)
        if choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs a non-empty tools list")
        return cls(choice if tools else "none", tools, None, parallel)

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def finish_reason(self, finish: str | None, called: bool) -> str | None:
        """``tool_calls`` when an auto / required output stopped with calls (a named call
        keeps ``stop``, as with vLLM); ``length`` stays."""
        if called and finish == "stop" and self.choice in ("auto", "required"):
            return "tool_calls"
        return finish

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema the output is constrained to (None for none / auto)."""
        if self.choice == "named":
            tool = next(t for t in self.tools if t.function.name == self.name)
            return _parameters(tool)
        if self.choice != "required":
            return None
        items = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [t.function.name]},
                    "parameters": _parameters(t),
                },
                "required": ["name", "parameters"],
            }
            for t in self.tools
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(message content, tool calls) of a finished output."""
        content, calls = self._parse(text)
        return content, calls if self.parallel else calls[:1]

    def _parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        if self.choice == "named":
            return None, [_call(self.name or "", text)]
        if self.choice == "required":
            try:
                calls = json.loads(text)
                return None, [_call(c["name"], c.get("parameters", {})) for c in calls]
            except (ValueError, TypeError, KeyError):  # cut short by max_tokens
                return text, []
        if self.choice != "auto" or TOOL_CALL_START not in text:
            return text, []
        content, _, rest = text.partition(TOOL_CALL_START)
        calls = []
        for block in rest.split(TOOL_CALL_START):
            call = _hermes_call(block.split(TOOL_CALL_END, 1)[0])
            if call is None:
                return text, []
            calls.append(call)
        return content or None, calls

    def streamer(self) -> ToolCallStreamer:
        return ToolCallStreamer(self)


def _hermes_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
        return _call(str(obj["name"]), obj.get("arguments", {}))
    except (ValueError, TypeError, KeyError):
        return None


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that starts ``marker`` (may still become it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolCallStreamer:
    """Turns the cumulative output text into chat-delta fields (``content`` and/or
    ``tool_calls``), each piece sent once; ``called`` says whether any call was sent."""

    def __init__(self, mode: ToolMode) -> None:
        self.mode = mode
        self.sent = 0  # characters of the text consumed
        self.index = 0  # tool calls sent
        self.decoder = json.JSONDecoder()

    @property
    def called(self) -> bool:
        return self.index > 0

    def feed(self, text: str, finished: bool) -> dict[str, Any]:
        choice = self.mode.choice
        if choice == "named":
            return self._named(text)
        calls: list[dict[str, Any]] = []
        content = ""
        if choice == "required":
            calls = self._required(text)
        else:
            content, calls = self._auto(text, finished)
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _indexed(self, call: dict[str, Any]) -> dict[str, Any] | None:
        if self.index > 0 and not self.mode.parallel:
            return None
        self.index += 1
        return {"index": self.index - 1, **call}

    def _named(self, text: str) -> dict[str, Any]:
        piece, self.sent = text[self.sent :], len(text)
        if self.index == 0:
            return {"tool_calls": [self._indexed(_call(self.mode.name or "", piece))]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else {}

    def _required(self, text: str) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []
        while True:
            pos = self.sent
            while pos < len(text) and text[pos] in " \t\n\r[,":
                pos += 1
            try:
                obj, end = self.decoder.raw_decode(text, pos)
            except ValueError:
                return calls
            self.sent = end
            if isinstance(obj, dict) and "name" in obj:
                call = self._indexed(_call(str(obj["name"]), obj.get("parameters", {})))
                calls += [call] if call is not None else []

    def _auto(self, text: str, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        content, calls = "", list[dict[str, Any]]()
        while True:
            start = text.find(TOOL_CALL_START, self.sent)
            if start < 0:
                end = len(text) if finished else len(text) - _held_prefix(text, TOOL_CALL_START)
                if self.index == 0 or text[self.sent : end].strip():
                    content += text[self.sent : end]
                self.sent = max(self.sent, end)
                return content, calls
            if self.index == 0:
                content += text[self.sent : start]
            self.sent = start
            close = text.find(TOOL_CALL_END, start)
            if close < 0 and not finished:
                return content, calls
            body_end = close if close >= 0 else len(text)
            after = body_end + len(TOOL_CALL_END) if close >= 0 else len(text)
            call = _hermes_call(text[start + len(TOOL_CALL_START) : body_end])
            indexed = self._indexed(call) if call is not None else None
            if call is None:
                content += text[start:after]
            elif indexed is not None:
                calls.append(indexed)
            self.sent = after
