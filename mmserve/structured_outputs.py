"""What a request constrains its output to (vLLM's ``StructuredOutputsParams``), no torch.

Exactly one of ``json`` (a JSON schema), ``json_object`` (any JSON object), ``regex``,
``choice`` (one of the given strings) and ``grammar`` (xgrammar EBNF) is set. The engine
compiles it against the tokenizer (``engine.grammar.GrammarCompiler``) and stores the result in
``compiled``; the worker keeps one matcher per request and masks the tokens it cannot accept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The whitespace JSON output may put at any one place between tokens of the structure (as
# outlines' default ``[ ]?`` does). With unbounded whitespace a small model can emit spaces
# forever and never close the object; 8 still let the random tiny models fill 120 tokens.
MAX_JSON_WHITESPACE = 2


@dataclass
class StructuredOutputsParams:
    """One output constraint; ``key`` identifies it for the compile cache."""

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    compiled: Any = field(default=None, compare=False, repr=False)  # set by the engine

    def __post_init__(self) -> None:
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json schema is not valid JSON: {exc}") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError("json schema must be a JSON object")
        if self.choice is not None:
            self.choice = [str(c) for c in self.choice]
            if not self.choice or any(not c for c in self.choice):
                raise ValueError("choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string")
        set_fields = [name for name in ("json", "regex", "choice", "grammar") if self._has(name)]
        set_fields += ["json_object"] if self.json_object else []
        if len(set_fields) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, json_object, regex, choice,"
                f" grammar; got {', '.join(set_fields) or 'none'}"
            )

    def _has(self, name: str) -> bool:
        return getattr(self, name) is not None

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(name for name in ("json", "regex", "choice", "grammar") if self._has(name))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal keys compile to the same grammar."""
        kind = self.kind
        if kind in ("json", "choice"):
            return kind, json.dumps(getattr(self, kind), sort_keys=True)
        if kind == "json_object":
            return kind, ""
        return kind, str(getattr(self, kind))
