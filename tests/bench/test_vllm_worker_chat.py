"""The vLLM worker's chats (``bench/lib/engines/vllm_worker.py``, run by vLLM's python) render
the prompts mmserve renders for the same conversation, so the engines prefill the same text.
vLLM itself is not needed: the worker's stepping is replaced by a recorder."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from mmserve.bench.lib.images import png_bytes
from mmserve.bench.multiturn.conversation import followup_question, history_answer, question
from mmserve.entrypoints.chat_utils import render_chat
from mmserve.models.tiny import resolve_model_path

ENGINES = Path(__file__).resolve().parents[2] / "mmserve" / "bench" / "lib" / "engines"


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ENGINES))  # the worker imports its siblings as top level
    monkeypatch.delitem(sys.modules, "vllm_worker", raising=False)
    return importlib.import_module("vllm_worker")


@pytest.mark.parametrize("model", ["tiny-smolvlm", "tiny-llava-onevision", "tiny-qwen2-vl"])
@pytest.mark.parametrize("new_images", [True, False])
def test_the_vllm_worker_sends_the_chat_mmserve_renders(
    worker: ModuleType,
    model: str,
    new_images: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    sent: list[str] = []

    def recording_drive(llm: Any, prompts: list[tuple[str, dict]], params: Any) -> tuple:
        ((req_id, prompt),) = prompts
        sent.append(prompt["prompt"])
        out = SimpleNamespace(
            outputs=[SimpleNamespace(text="<unused7>" * 4, token_ids=[7] * 4)],
            prompt_token_ids=[0],
            num_cached_tokens=0,
        )
        return {req_id: 1.0}, {req_id: out}

    monkeypatch.setattr(worker, "drive", recording_drive)
    turns, conv = [], []
    for t in range(3):
        text = question(t) if new_images else followup_question(t)
        image = None
        if new_images or t == 0:
            image = tmp_path / f"{t}.png"
            image.write_bytes(png_bytes(t, (32, 24)))
        turns.append(
            {"image": str(image) if image else None, "text": text, "answer": history_answer(t)}
        )
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if image is not None:
            content.insert(0, {"type": "image"})
        conv.append({"role": "user", "content": content})
        conv.append({"role": "assistant", "content": history_answer(t)})
    worker.run_conversation(SimpleNamespace(get_tokenizer=lambda: tokenizer), turns, None, "c")
    for t in range(3):
        assert sent[t] == render_chat(tokenizer, conv[: 2 * t + 1]), t
        if t:
            assert history_answer(t - 1) in sent[t]


class VLLMValidationError(Exception):
    """As installed vLLM's ``vllm.exceptions`` has it: a ``VLLMClientError``, no ``ValueError``."""


@pytest.mark.parametrize("error", [ValueError, VLLMValidationError])
def test_a_turn_vllm_refuses_ends_the_chat_and_keeps_the_turns_before(
    worker: ModuleType, error: type[Exception], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exceptions = ModuleType("vllm.exceptions")
    exceptions.VLLMValidationError = VLLMValidationError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.exceptions", exceptions)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen2-vl"))

    def drive_refusing_turn_2(llm: Any, prompts: list[tuple[str, dict]], params: Any) -> tuple:
        ((req_id, _),) = prompts
        if req_id.endswith("-1"):
            raise error("The decoder prompt (length 11162) is longer than the maximum")
        out = SimpleNamespace(
            outputs=[SimpleNamespace(text="a", token_ids=[7])],
            prompt_token_ids=[0, 1],
            num_cached_tokens=0,
        )
        return {req_id: 1.0}, {req_id: out}

    monkeypatch.setattr(worker, "drive", drive_refusing_turn_2)
    image = tmp_path / "0.png"
    image.write_bytes(png_bytes(0, (32, 24)))
    turns = [
        {"image": str(image), "text": question(t), "answer": history_answer(t)} for t in range(3)
    ]
    llm = SimpleNamespace(get_tokenizer=lambda: tokenizer)
    refused: list[str] = []
    rows = worker.run_conversation(llm, turns, None, "c", refused)
    assert [r["turn"] for r in rows] == [1]
    assert refused == ["turn 2: The decoder prompt (length 11162) is longer than the maximum"]
    with pytest.raises(error, match="11162"):  # other callers still see the error
        worker.run_conversation(llm, turns, None, "c")
