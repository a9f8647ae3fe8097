"""File-writing steps shared by the tiny checkpoint builders and the hub layouts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as the builds write every JSON file: sorted keys, indent 2, final newline."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``edit`` in place to the JSON object in ``path`` and write it back."""
    data = json.loads(path.read_text())
    edit(data)
    write_json(path, data)


def write_hub_chat_template(out: Path, template: str) -> None:
    """Put ``template`` where Qwen2-VL and LLaVA-OneVision hub repositories keep it: in
    ``chat_template.json`` and in the tokenizer config (for callers that load only the
    tokenizer). ``tokenizer_config.json`` must already be written."""
    write_json(out / "chat_template.json", {"chat_template": template})
    edit_json(out / "tokenizer_config.json", lambda config: config.update(chat_template=template))


def save_processor_files(
    out: Path,
    tokenizer: PreTrainedTokenizerFast,
    image_processor: Any,
    processor: Any | None = None,
) -> None:
    """Tokenizer files, ``preprocessor_config.json`` and, given a processor, its
    ``processor_config.json`` (plus the chat template it carries), each family's processor
    classes being what differs."""
    if processor is not None:
        processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
