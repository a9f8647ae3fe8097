"""One multi-turn image chat per engine and round: every turn adds a new image and a short
question and sends the whole history, its answers fixed (``history_answer``); each round's
conversation runs on a fresh engine, warmed up on other images.
``run_conversation(..., new_images=False)`` is the other common chat: one image on turn 1,
then text follow-up questions about it (``bench real``'s follow-up rows)."""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mmserve.bench.lib.engines.meter import Meter
from mmserve.bench.lib.engines.runners import make_runner
from mmserve.bench.lib.engines.vllm_baseline import ImageDir, engine_args, run_worker
from mmserve.bench.lib.images import png_bytes
from mmserve.engine_args import EngineArgs

WARMUP_SEED = 90_000
REPEAT_STRIDE = 1_000  # image seeds of repeat r: r * REPEAT_STRIDE + turn


def question(turn: int) -> str:
    return f"What changed in picture {turn + 1}?"


def followup_question(turn: int) -> str:
    """Turn ``turn``'s question of the chat about one image."""
    return "What is in the picture?" if turn == 0 else f"Tell me more, detail {turn}."


def history_answer(turn: int) -> str:
    """The assistant's turn ``turn`` as the history sends it back, the same for every engine:
    random weights answer differently per engine and dtype, and an answer's text can
    re-tokenize into many more tokens than were generated (a shape preset's filler tokens),
    which would give each engine other prompts to prefill."""
    return f"Picture {turn + 1} shows shapes in a few colours on a plain background."


def run_conversation(
    runner: Any,
    turns: int,
    resolution: str | tuple[int, int],
    answer_tokens: int,
    seed0: int,
    new_images: bool = True,
) -> list[dict[str, Any]]:
    """One conversation; every turn sends the whole history (images as PNG bytes).
    ``new_images``: a new image every turn (image ``seed0 + turn``), else image ``seed0`` on
    turn 1 and text follow-ups (``followup_question``) after it."""
    messages: list[dict[str, Any]] = []
    rows = []
    for turn in tqdm(range(turns), desc=f"{runner.name} turns", leave=False):
        text = question(turn) if new_images else followup_question(turn)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if new_images or turn == 0:
            image = {"type": "image", "image": png_bytes(seed0 + turn, resolution)}
            content.insert(0, image)
        messages.append({"role": "user", "content": content})
        result = runner.chat_turn(messages, answer_tokens)
        messages.append({"role": "assistant", "content": history_answer(turn)})
        rows.append({"turn": turn + 1, **vars(result)})
    return rows


def run_vllm(
    args: argparse.Namespace, python: str, pkw: dict[str, Any], rnd: int
) -> list[dict[str, Any]]:
    """Round ``rnd``'s conversation on a fresh vLLM worker (warmed up on a separate one)."""
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as tmp:
        images = ImageDir(Path(tmp), args.resolution)

        def conversation(seed0: int, turns: int) -> list[dict]:
            return [
                {"image": images.path(seed0 + t), "text": question(t), "answer": history_answer(t)}
                for t in range(turns)
            ]

        payload = {
            "kind": "multiturn",
            "max_tokens": args.answer_tokens,
            "engine_args": engine_args(args.max_model_len, args.turns, pkw),
            "warmup": conversation(WARMUP_SEED, 2),
            "conversations": [conversation(rnd * REPEAT_STRIDE, args.turns)],
        }
        result = run_worker(python, args.model, payload, args.threads)
    return result["conversations"][0]


def run_engine_round(
    kind: str, args: argparse.Namespace, pkw: dict[str, Any], python: str | None, rnd: int
) -> list[dict[str, Any]]:
    """One conversation (round ``rnd``'s images) on a fresh engine, warmed up on other images."""
    if kind == "vllm":
        if python is None:
            raise SystemExit("vllm is not importable here: pass --vllm-python")
        return run_vllm(args, python, pkw, rnd)
    extra: dict[str, Any] = {"processor_kwargs": pkw}
    if kind != "transformers":
        extra = EngineArgs.from_cli_args(args).as_kwargs(
            processor_kwargs=pkw, limit_mm_per_prompt={"image": max(args.turns, 2)}
        )
        del extra["model"]
    runner = make_runner(kind, args.model, **extra)
    run_conversation(runner, 2, args.resolution, 2, WARMUP_SEED)  # warm-up, other images
    gc.collect()  # an earlier engine's garbage is not collected inside the timed turns
    meter = Meter()
    rows = run_conversation(
        runner, args.turns, args.resolution, args.answer_tokens, rnd * REPEAT_STRIDE
    )
    rows[-1]["meter"] = meter.stop()
    del runner
    return rows
