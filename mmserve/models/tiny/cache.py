"""Resolve a model name or path, building preset checkpoints into a local cache on first use."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .presets import BUILD_VERSION, PRESET_NAMES, build_preset

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
    """Return the cached build of preset ``name``, building it atomically if missing.

    The build goes into a temporary sibling directory that is then renamed into place, so
    readers never see a partial checkpoint; if a concurrent builder renamed its copy first,
    ours is discarded and theirs is used.
    """
    target = preset_cache_path(name, cache_dir)
    if _is_checkpoint(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build_preset(name, tmp)
        try:
            os.replace(tmp, target)  # atomic; fails if another builder's target is non-empty
        except OSError:
            if not _is_checkpoint(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name_or_path: str) -> Path:
    """Map a preset name to its cached checkpoint dir, or validate a checkpoint directory.

    Preset names win over same-named relative directories. Raises ``ValueError`` otherwise.
    """
    if name_or_path in PRESET_NAMES:
        return ensure_preset(name_or_path)
    path = Path(name_or_path).expanduser()
    if _is_checkpoint(path):
        return path.resolve()
    raise ValueError(
        f"unknown model {name_or_path!r}: not a preset ({', '.join(PRESET_NAMES)}) "
        "nor a directory with config.json"
    )
