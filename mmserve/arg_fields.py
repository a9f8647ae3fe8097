"""Dataclass fields that declare their own command-line flag (torch-free).

A settings dataclass declares each field with ``arg_field`` / ``env_arg_field`` (default, help
text, argparse options in the field's metadata); ``add_field_flags`` then turns every field into
one ``--flag``, so a setting's name, type, default and help live in one place.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import field, fields
from typing import Any


def arg_field(default: Any, help_text: str, secret: bool = False, **cli: Any) -> Any:
    """A field with its help text and CLI options (``type``, ``choices``, ``metavar``,
    ``aliases``); ``secret``: left out of the repr (and so of logs)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help_text, **cli})
    return field(default=default, repr=not secret, metadata={"help": help_text, **cli})


def env_arg_field(env: str, default: str, help_text: str, **cli: Any) -> Any:
    """A field whose default is ``$env`` when set (the test suite's ``--device`` sets them)."""
    help_text = f"{help_text}; ${env} sets the default"
    return field(
        default_factory=lambda: os.environ.get(env) or default,
        metadata={"help": help_text, **cli},
    )


def _scalar_type(annotation: str) -> type:
    return float if "float" in annotation else int if "int" in annotation else str


def add_field_flags(
    settings_class: Any,
    parser: argparse.ArgumentParser | Any,
    defaults: dict[str, Any] | None = None,
    exclude: tuple[str, ...] = (),
) -> None:
    """One ``--flag`` per field of ``settings_class`` (``--no-flag`` for booleans), defaults
    from the fields (``defaults`` overrides some; ``exclude`` leaves some out)."""
    for f in fields(settings_class):
        if f.name in exclude:
            continue
        meta = dict(f.metadata)
        flag = "--" + f.name.replace("_", "-")
        default = f.default_factory() if callable(f.default_factory) else f.default
        default = (defaults or {}).get(f.name, default)
        shown = json.dumps(default) if isinstance(default, dict) else default
        text = f"{meta.pop('help')} (default: {shown})".replace("%", "%%")
        if f.type in ("bool", "bool | None"):  # None: unset, neither flag given
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=text
            )
            continue
        aliases = meta.pop("aliases", ())
        kind = meta.pop("type", _scalar_type(str(f.type)))
        parser.add_argument(flag, *aliases, type=kind, default=default, help=text, **meta)
