"""The README's request-field table names every field the server implements or refuses."""

from __future__ import annotations

import re
from pathlib import Path

from mmserve.entrypoints.openai.completions.protocol import ChatCompletionRequest, CompletionRequest
from mmserve.entrypoints.openai.completions.request_fields import REFUSED_CHAT, REFUSED_COMPLETION

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_implemented_and_refused_field() -> None:
    rows = [line for line in README.read_text().splitlines() if line.startswith("| implemented")]
    rows += [line for line in README.read_text().splitlines() if line.startswith("| refused")]
    listed = set(re.findall(r"`([a-z_]+)", "\n".join(rows)))
    fields = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    missing = (fields | set(REFUSED_CHAT) | set(REFUSED_COMPLETION)) - listed
    assert not missing, f"README's request-field table lacks {sorted(missing)}"
