"""Compiling output constraints (``StructuredOutputsParams``) with xgrammar.

xgrammar was chosen over outlines-core by measured per-token CPU overhead (mask fill + apply +
advance) and compile time; see ``benchmarks/grammar_overhead.py`` and docs/serving.md.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from mmserve.extras import MissingExtra, require_extra
from mmserve.structured_outputs import MAX_JSON_WHITESPACE, StructuredOutputsParams

_XGRAMMAR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[time] file.cc:12: "


class StructuredOutputsUnavailable(ValueError):
    """xgrammar (the ``structured`` extra) is not installed: a constrained request is refused
    with this one line naming what to install; unconstrained requests run as usual."""


def choice_grammar(choices: list[str]) -> str:
    """EBNF accepting exactly one of ``choices`` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles constraints against one tokenizer; thread-safe (admission threads and the
    engine thread call it).

    Invariants: the xgrammar tokenizer info and compiler are built on first use only, so an
    engine whose requests never constrain their output never pays for them; compiled grammars
    are cached by content by xgrammar itself (bounded by ``cache_limit_bytes``), so a schema
    sent again is not compiled again. Stop tokens are the model's EOS ids: a finished grammar
    allows only them.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        cache_limit_bytes: int = 256 << 20,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.cache_limit_bytes = cache_limit_bytes
        self._compiler: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._compiler is None:
                try:
                    xgr = require_extra(
                        "xgrammar",
                        "structured",
                        "a structured output constraint (response_format, structured_outputs,"
                        " guided_*, tool_choice)",
                    )
                except MissingExtra as exc:
                    raise StructuredOutputsUnavailable(str(exc)) from None
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer,
                    vocab_size=self.vocab_size,
                    stop_token_ids=self.eos_token_ids or None,
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=1, cache_limit_bytes=self.cache_limit_bytes
                )
            return self._compiler

    def compile(self, spec: StructuredOutputsParams) -> StructuredOutputsParams:
        """Fill ``spec.compiled`` (once); an invalid constraint is a ValueError naming it."""
        if spec.compiled is not None:
            return spec
        compiler = self._get()
        kind = spec.kind
        try:
            if kind in ("json", "json_object"):
                schema = spec.json if kind == "json" else {"type": "object"}
                spec.compiled = compiler.compile_json_schema(
                    json.dumps(schema),
                    any_whitespace=True,
                    max_whitespace_cnt=MAX_JSON_WHITESPACE,
                    strict_mode=kind == "json",  # json_object: any keys
                )
            elif kind == "regex":
                spec.compiled = compiler.compile_regex(spec.regex)
            elif kind == "choice":
                spec.compiled = compiler.compile_grammar(choice_grammar(spec.choice or []))
            else:
                spec.compiled = compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = _XGRAMMAR_PREFIX.sub("", (str(exc).strip() or repr(exc)).splitlines()[0])
            message = f"structured_outputs {kind} cannot be compiled: {reason[:300]}"
            raise ValueError(message) from None
        return spec
