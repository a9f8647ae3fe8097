"""Settings given in Python (``LLM(...)``, ``EngineArgs(...)``) read as their fields' types say
(torch-free).

The command line types every value through its flag's parser; a keyword argument arrives as
the caller wrote it. ``read_field_values`` gives both the same result: a string is read as the
field's flag reads it (``kv_cache_memory="1GiB"`` as ``--kv-cache-memory 1GiB``), a path as its
string, a tuple as a list; any other value that is not of the field's type is a ``ValueError``
naming the field and the value, before anything loads. (Unchecked, ``"8"`` failed deep in the
engine with a ``TypeError`` and ``enable_prefix_caching="no"`` switched the cache on.)
``check_field_types`` is the check alone, for settings that have no flags (``SamplingParams``).
"""

from __future__ import annotations

import argparse
import numbers
import os
import types
import typing
from collections.abc import Callable
from dataclasses import Field, fields
from typing import Any

Check = Callable[[Any], bool]
# settings class -> (field, resolved annotation, its type check) per field, built once
_FIELD_CHECKS: dict[type, list[tuple[Field[Any], Any, Check]]] = {}


def _field_checks(settings_class: type) -> list[tuple[Field[Any], Any, Check]]:
    if settings_class not in _FIELD_CHECKS:
        hints = typing.get_type_hints(settings_class)
        _FIELD_CHECKS[settings_class] = [
            (f, hints[f.name], _checker(hints[f.name])) for f in fields(settings_class)
        ]
    return _FIELD_CHECKS[settings_class]


def check_field_types(settings: Any) -> None:
    """``ValueError`` naming the first field of the dataclass instance ``settings`` whose value
    is not of its annotated type (a dict's keys and values and a list's items too)."""
    for f, _, check in _field_checks(type(settings)):
        value = getattr(settings, f.name)
        if not check(value):
            raise ValueError(f"{f.name} must be {f.type}, got {value!r}")


def read_field_values(settings: Any) -> None:
    """Each field of the dataclass instance ``settings`` read as its annotation says (module
    doc), in place, then checked; ``ValueError`` names the first one that cannot be."""
    for f, hint, _ in _field_checks(type(settings)):
        setattr(settings, f.name, _read(f, hint, getattr(settings, f.name)))
    check_field_types(settings)


def _read(f: Field[Any], hint: Any, value: Any) -> Any:
    """``value`` as the field takes it, where a string, path or tuple stands for it."""
    if isinstance(value, os.PathLike) and _admits(hint, str):
        return os.fspath(value)
    if isinstance(value, tuple) and _admits(hint, list):
        return list(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value) if _admits(hint, int) or _admits(hint, float) else value
    if not isinstance(value, str) or _admits(hint, str) or _admits(hint, bool):
        return value
    if "nargs" in f.metadata:  # the flag parses each of several words, not one string
        return value
    parser = f.metadata.get("type") or (float if _admits(hint, float) else int)
    try:
        return parser(value)
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"{f.name}: {err}") from None
    except ValueError:
        raise ValueError(f"{f.name} must be {f.type}, got {value!r}") from None


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation, else the annotation alone."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _admits(hint: Any, kind: type) -> bool:
    return any((typing.get_origin(option) or option) is kind for option in _options(hint))


def _checker(hint: Any) -> Check:
    """A test of whether a value is of the annotation's type (a dict's or list's items too),
    built once per field so that a check runs no ``typing`` calls."""
    checks = [_option_checker(option) for option in _options(hint)]
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:  # X | None, the usual union
        first, second = checks
        return lambda value: first(value) or second(value)
    return lambda value: any(check(value) for check in checks)


def _option_checker(option: Any) -> Check:
    origin, args = typing.get_origin(option) or option, typing.get_args(option)
    if option is Any:
        return lambda value: True
    if option is type(None):
        return lambda value: value is None
    if origin is bool:
        return lambda value: isinstance(value, bool)
    if origin is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if origin is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is dict:
        key_ok, value_ok = _checker(args[0]), _checker(args[1])
        return lambda value: (
            isinstance(value, dict) and all(key_ok(k) and value_ok(v) for k, v in value.items())
        )
    if origin is list:
        item_ok = _checker(args[0])
        return lambda value: isinstance(value, list) and all(item_ok(item) for item in value)
    return lambda value: isinstance(value, origin)
