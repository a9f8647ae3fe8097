"""Value parsers of the command-line flags, in vLLM's syntax where vLLM has one (torch-free).

Each raises ``argparse.ArgumentTypeError`` with the offending text, so argparse reports
``argument --flag: <message>``.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

# modalities vLLM's --limit-mm-per-prompt knows; mmserve's models take images only
KNOWN_MODALITIES = ("image", "video", "audio")


def parse_bytes(text: str) -> int:
    """``1073741824``, ``512MiB``, ``1G``, ``1.5GB`` -> bytes (K/M/G/T are powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 512MiB, 1GiB)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def human_readable_int(text: str) -> int:
    """vLLM's integer syntax: ``2048``, ``2k`` / ``25.6k`` (lowercase: powers of 1000),
    ``2K`` / ``32K`` (uppercase: powers of 1024, whole numbers only)."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not an integer: {text!r} (e.g. 2048, 2k = 2000, 2K = 2048)"
        )
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        hint = f"; did you mean {number}{suffix.lower()}?" if suffix else ""
        raise argparse.ArgumentTypeError(
            f"decimals need a lowercase (decimal) suffix, got {text!r}{hint}"
        )
    return int(number) * _BINARY.get(suffix, 1)


def human_readable_int_or_auto(text: str) -> int | None:
    """``human_readable_int`` plus ``auto`` / ``-1``: None (the model's own limit)."""
    if text.strip().lower() in ("auto", "-1"):
        return None
    return human_readable_int(text)


def parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _count(value: Any) -> int | None:
    if isinstance(value, dict):  # vLLM's per-modality options: {"count": 2, "width": ...}
        value = value.get("count")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def parse_mm_limits(text: str) -> dict[str, int]:
    """``'{"image": 2, "video": 0}'`` -> {"image": 2, "video": 0}; ``{"image": {"count": 2}}``
    (vLLM's long form) -> {"image": 2}; anything else is a usage error."""
    value = parse_json_object(text)
    limits: dict[str, int] = {}
    for modality, raw in value.items():
        count = _count(raw)
        if count is None:
            raise argparse.ArgumentTypeError(
                f'expected a JSON object of non-negative counts like {{"image": 2}}, got {text!r}'
            )
        if modality not in KNOWN_MODALITIES:
            raise argparse.ArgumentTypeError(
                f"unknown modality {modality!r} in {text!r} (known: {', '.join(KNOWN_MODALITIES)})"
            )
        limits[modality] = count
    return limits
