"""The vLLM-compatibility page's request-field table names every field the server implements or
refuses."""

from __future__ import annotations

import re
from pathlib import Path

from mmserve.entrypoints.openai.completions.protocol import ChatCompletionRequest, CompletionRequest
from mmserve.entrypoints.openai.completions.request_fields import REFUSED_CHAT, REFUSED_COMPLETION

FIELDS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "vllm-compatibility.md"


def test_field_table_lists_every_implemented_and_refused_field() -> None:
    lines = FIELDS_PAGE.read_text().splitlines()
    rows = [line for line in lines if line.startswith(("| implemented", "| refused"))]
    listed = set(re.findall(r"`([a-z_]+)", "\n".join(rows)))
    fields = set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)
    missing = (fields | set(REFUSED_CHAT) | set(REFUSED_COMPLETION)) - listed
    assert not missing, f"{FIELDS_PAGE.name}'s request-field table lacks {sorted(missing)}"
