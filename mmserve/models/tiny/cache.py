"""Resolve a model name or path, building preset checkpoints into a local cache on first use
(hub model IDs are downloaded by ``models.checkpoint.hub``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..checkpoint.hub import download_checkpoint, is_hub_id
from .hub_layouts import HUB_LAYOUTS, LAYOUT_NAMES, LAYOUT_VERSION
from .presets import BUILD_VERSION, PRESET_NAMES, build_preset
from .shapes import SHAPE_BUILD_VERSION, SHAPE_NAMES, build_shape

CACHE_ENV = "MMSERVE_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MMSERVE_CACHE_DIR`` if set, else ``~/.cache/mmserve``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mmserve"


def preset_cache_path(name: str, cache_dir: Path | None = None) -> Path:
    """Where preset ``name`` of the current ``BUILD_VERSION`` lives in the cache."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    return root / "models" / f"{name}-v{BUILD_VERSION}"


def _is_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def ensure_preset(name: str, cache_dir: Path | None = None) -> Path:
    """Return the cached build of preset ``name``, building it atomically if missing."""
    return _ensure_built(preset_cache_path(name, cache_dir), lambda tmp: build_preset(name, tmp))


def ensure_shape(name: str, cache_dir: Path | None = None) -> Path:
    """Return the cached build of real-size shape ``name`` (``shape:...``), building it if
    missing (seconds per GB; the directory name drops the colon)."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / "models" / f"{name.replace(':', '-')}-v{SHAPE_BUILD_VERSION}"
    return _ensure_built(target, lambda tmp: build_shape(name, tmp))


def ensure_layout(name: str, cache_dir: Path | None = None) -> Path:
    """Return the cached copy of hub layout ``name`` (its preset's files, rearranged)."""
    base, edit = HUB_LAYOUTS[name]
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / "models" / f"{name}-v{BUILD_VERSION}.{LAYOUT_VERSION}"

    def build(tmp: Path) -> None:
        shutil.copytree(ensure_preset(base, cache_dir), tmp, dirs_exist_ok=True)
        edit(tmp)

    return _ensure_built(target, build)


def _ensure_built(target: Path, build: Callable[[Path], object]) -> Path:
    """Build into a temporary sibling directory that is then renamed into place, so readers
    never see a partial checkpoint; if a concurrent builder renamed its copy first, ours is
    discarded and theirs is used."""
    if _is_checkpoint(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)  # atomic; fails if another builder's target is non-empty
        except OSError:
            if not _is_checkpoint(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(
    name_or_path: str, revision: str | None = None, download_dir: str | Path | None = None
) -> Path:
    """The local checkpoint directory of a model name, first match wins: a preset, hub layout
    or ``shape:`` name, built into the cache; an existing local directory with config.json; a
    hub ID ``ORG/NAME``, downloaded at ``revision`` into ``download_dir``
    (``models.checkpoint.hub``; both are ignored for presets, shapes and directories). Raises
    ``ValueError`` otherwise.
    """
    if name_or_path in PRESET_NAMES:
        return ensure_preset(name_or_path)
    if name_or_path in LAYOUT_NAMES:
        return ensure_layout(name_or_path)
    if name_or_path in SHAPE_NAMES:
        return ensure_shape(name_or_path)
    path = Path(name_or_path).expanduser()
    if _is_checkpoint(path):
        return path.resolve()
    if is_hub_id(name_or_path):
        return download_checkpoint(name_or_path, revision, download_dir)
    raise ValueError(
        f"unknown model {name_or_path!r}: neither a preset"
        f" ({', '.join(PRESET_NAMES + LAYOUT_NAMES + SHAPE_NAMES)}), "
        "a directory with config.json, nor a hub ID (ORG/NAME)"
    )
