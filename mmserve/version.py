"""The installed mmserve version (``mmserve --version``, ``GET /version``), torch-free."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed distribution's version (``0+unknown`` when run from a bare checkout)."""
    try:
        return version("mmserve")
    except PackageNotFoundError:
        return "0+unknown"
