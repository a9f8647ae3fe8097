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
from dataclasses import Field, fields
from typing import Any

_HINTS: dict[type, dict[str, Any]] = {}  # settings class -> its fields' annotations, resolved


def _field_hints(settings_class: type) -> dict[str, Any]:
    if settings_class not in _HINTS:
        _HINTS[settings_class] = typing.get_type_hints(settings_class)
    return _HINTS[settings_class]


def check_field_types(settings: Any) -> None:
    """``ValueError`` naming the first field of the dataclass instance ``settings`` whose value
    is not of its annotated type (a dict's keys and values and a list's items too)."""
    hints = _field_hints(type(settings))
    for f in fields(settings):
        value = getattr(settings, f.name)
        if not _matches(value, hints[f.name]):
            raise ValueError(f"{f.name} must be {f.type}, got {value!r}")


def read_field_values(settings: Any) -> None:
    """Each field of the dataclass instance ``settings`` read as its annotation says (module
    doc), in place; ``ValueError`` names the first one that cannot be."""
    hints = _field_hints(type(settings))
    for f in fields(settings):
        hint = hints[f.name]
        value = _read(f, hint, getattr(settings, f.name))
        if not _matches(value, hint):
            raise ValueError(f"{f.name} must be {f.type}, got {value!r}")
        setattr(settings, f.name, value)


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


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotation's type (a dict's or list's items too)."""
    for option in _options(hint):
        origin, args = typing.get_origin(option) or option, typing.get_args(option)
        if option is Any:
            return True
        if option is type(None):
            ok = value is None
        elif origin is bool:
            ok = isinstance(value, bool)
        elif origin is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif origin is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif origin is dict:
            ok = isinstance(value, dict) and all(
                _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
            )
        elif origin is list:
            ok = isinstance(value, list) and all(_matches(item, args[0]) for item in value)
        else:
            ok = isinstance(value, origin)
        if ok:
            return True
    return False
