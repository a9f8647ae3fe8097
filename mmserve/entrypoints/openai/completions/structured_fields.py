"""The request fields that constrain the output, merged into one ``StructuredOutputsParams``.

Sources (at most one per request, else a 400): OpenAI's ``response_format`` (``json_object``,
``json_schema``; ``text`` is no constraint), vLLM's ``structured_outputs`` object (``json``,
``json_object``, ``regex``, ``choice``, ``grammar``), vLLM's older ``guided_json`` /
``guided_regex`` / ``guided_choice`` / ``guided_grammar``, and ``tool_choice`` ``required`` or
a named function (see ``tool_calls``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mmserve.entrypoints.openai.http.errors import APIError
from mmserve.structured_outputs import StructuredOutputsParams


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``; ``structural_tag`` (a vLLM extension) is refused."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's ``structured_outputs`` request object (the constraint kinds mmserve compiles)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_spec: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


def _from_response_format(fmt: ResponseFormat) -> StructuredOutputsParams | None:
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise ValueError("response_format json_schema needs json_schema.schema")
    return StructuredOutputsParams(json=fmt.json_schema.json_schema)


def _from_structured(obj: StructuredOutputsField) -> StructuredOutputsParams:
    return StructuredOutputsParams(
        json=obj.json_spec,
        json_object=bool(obj.json_object),
        regex=obj.regex,
        choice=obj.choice,
        grammar=obj.grammar,
    )


def _sources(
    req: Any, tool_schema: dict[str, Any] | None
) -> list[tuple[str, dict[str, Any] | ResponseFormat | StructuredOutputsField]]:
    """(field name, what it asks for) for every constraint field the request sets."""
    out: list[tuple[str, dict[str, Any] | ResponseFormat | StructuredOutputsField]] = []
    for name in ("response_format", "structured_outputs"):
        if getattr(req, name, None) is not None:
            out.append((name, getattr(req, name)))
    legacy = {
        "guided_json": "json",
        "guided_regex": "regex",
        "guided_choice": "choice",
        "guided_grammar": "grammar",
    }
    for name, kind in legacy.items():
        if getattr(req, name, None) is not None:
            out.append((name, {kind: getattr(req, name)}))
    if tool_schema is not None:
        out.append(("tool_choice", {"json": tool_schema}))
    return out


def structured_spec(
    req: Any, tool_schema: dict[str, Any] | None = None
) -> tuple[str, StructuredOutputsParams] | None:
    """(field, the request's one output constraint), or None; conflicts and bad specs are
    400s naming the field."""
    found: list[tuple[str, StructuredOutputsParams]] = []
    for name, value in _sources(req, tool_schema):
        try:
            if isinstance(value, ResponseFormat):
                spec = _from_response_format(value)
            elif isinstance(value, StructuredOutputsField):
                spec = _from_structured(value)
            else:
                spec = StructuredOutputsParams(**value)
        except ValueError as exc:
            raise APIError(400, f"{name}: {exc}", param=name) from None
        if spec is not None:
            found.append((name, spec))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise APIError(400, f"give only one output constraint, got {names}", param=found[1][0])
    return found[0] if found else None
