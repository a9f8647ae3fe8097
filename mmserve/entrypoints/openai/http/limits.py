"""What one HTTP request may ask of the server: declared once, flags generated from the fields.

Every limit is checked before any expensive work (template rendering, tokenization, fetching,
decoding) and answered with a 400 that names the limit and its flag, so one client's huge
request costs the server almost nothing and delays nobody else.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any


class LimitExceeded(ValueError):
    """A request exceeds a ``RequestLimits`` limit (HTTP 400 naming the limit and its flag)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = "limit_exceeded"


def _limit(default: int, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class RequestLimits:
    """Per-request limits of the OpenAI server (each one a ``--max-...`` flag)."""

    max_request_body_bytes: int = _limit(64 << 20, "largest request body in bytes (413 above)")
    max_json_depth: int = _limit(32, "deepest nesting of JSON arrays/objects in a body")
    max_json_values: int = _limit(1 << 18, "most JSON values (objects, arrays, scalars) in a body")
    max_chat_messages: int = _limit(1024, "most messages in one chat request")
    max_content_parts: int = _limit(1024, "most content parts over all messages of a request")
    max_text_bytes: int = _limit(1 << 20, "most UTF-8 bytes of text over all messages / prompt")
    max_stop_strings: int = _limit(64, "most stop strings per request")
    max_stop_string_length: int = _limit(256, "longest stop string in characters")
    max_id_length: int = _limit(
        256, "longest model name, message name, image uuid or cache_salt in characters"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name} must be a positive integer, got {value!r}")

    @staticmethod
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    def check(self, name: str, got: int, param: str | None = None) -> None:
        """Raise ``LimitExceeded`` naming the limit and its flag when ``got`` exceeds it."""
        limit = getattr(self, name)
        if got > limit:
            what = name.removeprefix("max_").replace("_", " ")
            raise LimitExceeded(
                f"{what}: {got} exceeds this server's limit of {limit} ({self.flag(name)})", param
            )


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--max-...`` flag per ``RequestLimits`` field, defaults from the dataclass."""
    group = parser.add_argument_group("request limits (each answered with a 400 when exceeded)")
    for f in fields(RequestLimits):
        group.add_argument(
            RequestLimits.flag(f.name),
            type=int,
            default=f.default,
            help=f"{f.metadata['help']} (default: %(default)s)",
        )


def limits_from_args(args: argparse.Namespace) -> RequestLimits:
    return RequestLimits(**{f.name: getattr(args, f.name) for f in fields(RequestLimits)})
