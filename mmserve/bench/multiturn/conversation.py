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


def chat_turns(turns: int, seed0: int, new_images: bool = True) -> list[dict[str, Any]]:
    """A chat's turns, the same for every engine: per turn the image's seed (None: a text
    follow-up), the question and the answer the history sends back. ``new_images``: a new
    image every turn (image ``seed0 + turn``), else image ``seed0`` on turn 1 and text
    follow-ups (``followup_question``) after it."""
    return [
        {
            "image_seed": seed0 + t if new_images or t == 0 else None,
            "text": question(t) if new_images else followup_question(t),
            "answer": history_answer(t),
        }
        for t in range(turns)
    ]


def vllm_chat(images: ImageDir, turns: int, seed0: int, new_images: bool = True) -> list[dict]:
    """``chat_turns`` as the vLLM worker takes them: each image as a PNG file's path."""
    return [
        {
            "image": None if t["image_seed"] is None else images.path(t["image_seed"]),
            "text": t["text"],
            "answer": t["answer"],
        }
        for t in chat_turns(turns, seed0, new_images)
    ]


def run_conversation(
    runner: Any,
    turns: int,
    resolution: str | tuple[int, int],
    answer_tokens: int,
    seed0: int,
    new_images: bool = True,
) -> list[dict[str, Any]]:
    """One conversation of ``chat_turns``; every turn sends the whole history (images as PNG
    bytes)."""
    messages: list[dict[str, Any]] = []
    rows = []
    chat = chat_turns(turns, seed0, new_images)
    for turn, spec in enumerate(tqdm(chat, desc=f"{runner.name} turns", leave=False)):
        content: list[dict[str, Any]] = [{"type": "text", "text": spec["text"]}]
        if spec["image_seed"] is not None:
            image = {"type": "image", "image": png_bytes(spec["image_seed"], resolution)}
            content.insert(0, image)
        messages.append({"role": "user", "content": content})
        result = runner.chat_turn(messages, answer_tokens)
        messages.append({"role": "assistant", "content": spec["answer"]})
        rows.append({"turn": turn + 1, **vars(result)})
    return rows


def run_vllm(
    args: argparse.Namespace, python: str, pkw: dict[str, Any], rnd: int
) -> list[dict[str, Any]]:
    """Round ``rnd``'s conversation on a fresh vLLM worker (warmed up on a separate one)."""
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as tmp:
        images = ImageDir(Path(tmp), args.resolution)
        payload = {
            "kind": "multiturn",
            "max_tokens": args.answer_tokens,
            "engine_args": engine_args(args.max_model_len, args.turns, pkw),
            "warmup": vllm_chat(images, 2, WARMUP_SEED),
            "conversations": [vllm_chat(images, args.turns, rnd * REPEAT_STRIDE)],
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
