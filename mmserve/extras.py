"""Optional dependencies (the package's extras, ``pip install 'mmserve[EXTRA]'``): import one,
or fail with one line naming the extra that brings it (torch-free)."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; the message is one line naming the setting that
    needs it and the ``pip install`` command of its extra (the CLI prints it, exit code 2)."""


def require_extra(module: str, extra: str, needed_by: str) -> ModuleType:
    """``module`` imported, or ``MissingExtra`` when it (or a package it needs) is missing.

    ``needed_by`` names what asked for it, e.g. ``encoder_store_redis (--encoder-store-redis)``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        raise MissingExtra(
            f"{needed_by} needs {missing!r}, which is not installed:"
            f" pip install 'mmserve[{extra}]'",
            name=missing,
        ) from None
