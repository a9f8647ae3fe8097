"""Video chat on a Qwen preset: piecewise (per frame group) encoding and caching.

Two parts, each repeated ``--rounds`` times on a fresh engine (medians with min-max):

- chat: a ``--chat-frames`` video, turn 1 then a follow-up turn 2 about the same video. Per turn:
  frame groups encoded, TTFT (admission + prefill up to the first token), admission seconds.
- memory: one prompt per video length in ``--frames`` under a fixed encoder budget (the floor:
  the largest possible frame group, from ``--max-pixels``). "Peak encoder memory" is measured
  two ways around every encoder call: the working set (bytes of the encoder-cache entries
  referenced when the call starts + the call's pixel input + its embeddings; exact) and the
  process RSS peak above the pre-call RSS (sampled every 0.5 ms, glibc mmap threshold fixed so
  freed tensors leave RSS; noisy: near 0 where the allocator reuses warm pages). Both are maxima
  over the prefill; the table gives them per length, the working set's ratio to the shortest
  video, and ``whole_video_io``: pixels + embeddings of all groups, what encoding the video in
  one call would hold at least.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from mmserve import LLM, SamplingParams
from mmserve.bench.lib.harness import spread
from mmserve.bench.lib.images import synthetic_image
from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.bench.lib.provenance import engine_versions
from mmserve.bench.lib.report import markdown_table, save
from mmserve.bench.probe import EncoderMeter, fix_mmap_threshold
from mmserve.inputs import PromptInput

VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def user(text: str, video: bool = True) -> str:
    return f"<|im_start|>user\n{VIDEO if video else ''}{text}<|im_end|>\n<|im_start|>assistant\n"


def make_video(seed: int, num_frames: int, size: tuple[int, int]) -> np.ndarray:
    """[T, H, W, 3] uint8: a slowly panning synthetic scene (frames differ)."""
    scene = np.asarray(synthetic_image(seed, (size[0] * 2, size[1])))
    shifts = np.linspace(0, size[0], num_frames).astype(int)
    return np.stack([scene[:, s : s + size[0]] for s in shifts])


class WorkingSet:
    """Wraps ``model.encode_images`` (after ``EncoderMeter``): per call, the referenced
    encoder-cache bytes + pixel input + embedding output bytes, and the RSS peak delta."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.rss = EncoderMeter(llm.engine.model)
        self.inner = llm.engine.model.encode_images
        llm.engine.model.encode_images = self  # type: ignore[method-assign]
        self.calls: list[dict[str, int]] = []

    def __call__(self, images: list[Any]) -> Any:
        cache = self.llm.engine.scheduler.encoder_cache
        held = sum(cache.sizes[k] for k in cache.referenced) * cache.bytes_per_embedding
        inputs = sum(int(np.asarray(d["pixel_values"]).nbytes) for d in images)
        out = self.inner(images)
        outputs = sum(int(t.nelement() * t.element_size()) for t in out)
        # the call's own embeddings are among the referenced entries: count them once
        held -= sum(int(t.shape[0]) for t in out) * cache.bytes_per_embedding
        rss = self.rss.calls[-1]["rss_peak_delta"]
        call = {"working_set": max(held, 0) + inputs + outputs, "io": inputs + outputs}
        self.calls.append(call | {"rss": rss})
        return out


def run_turn(llm: LLM, prompt: str, video: np.ndarray, max_tokens: int) -> dict[str, Any]:
    """One request stepped to its end: TTFT, admission time, groups encoded, answer text."""
    engine = llm.engine
    before = engine.get_metrics()["encoder_images_encoded"]
    start = time.perf_counter()
    inp = PromptInput.of({"prompt": prompt, "videos": [video]})
    processed = engine.intake.process(inp)
    admitted = time.perf_counter()
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    req_id = engine.intake.add_processed(processed, params, None, prompt)
    ttft = None
    while True:
        outs = [out for out in engine.step() if out.request_id == req_id]
        if outs and ttft is None and outs[-1].outputs[0].token_ids:
            ttft = time.perf_counter() - start
        if outs and outs[-1].finished:
            break
    return {
        "ttft_s": ttft,
        "admission_s": admitted - start,
        "groups_encoded": engine.get_metrics()["encoder_images_encoded"] - before,
        "prompt_tokens": len(processed.prompt_token_ids),
        "answer": outs[-1].outputs[0].text,
    }


def chat_round(args: argparse.Namespace, engine_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    llm = LLM(args.model, **engine_kwargs)
    run_turn(llm, user("Warm-up."), make_video(999, 4, args.size), 1)
    video = make_video(args.seed, args.chat_frames, args.size)
    first = user("What happens in this video?")
    turn1 = run_turn(llm, first, video, args.answer_tokens)
    second = first + turn1["answer"] + "<|im_end|>\n" + user("And at the end?", video=False)
    turn2 = run_turn(llm, second, video, args.answer_tokens)
    return [{"turn": 1, **turn1}, {"turn": 2, **turn2}]


def memory_round(args: argparse.Namespace, engine_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for num_frames in args.frames:
        llm = LLM(args.model, **engine_kwargs)
        fix_mmap_threshold()
        meter = WorkingSet(llm)
        run_turn(llm, user("Warm-up."), make_video(998, 2, args.size), 1)
        meter.calls.clear()
        video = make_video(args.seed + num_frames, num_frames, args.size)
        turn = run_turn(llm, user("Describe the video."), video, 1)
        rows.append(
            {
                "frames": num_frames,
                "groups_encoded": turn["groups_encoded"],
                "encoder_calls": len(meter.calls),
                "working_set_mib": max(c["working_set"] for c in meter.calls) / 2**20,
                "whole_video_io_mib": sum(c["io"] for c in meter.calls) / 2**20,
                "rss_peak_mib": max(c["rss"] for c in meter.calls) / 2**20,
                "ttft_s": turn["ttft_s"],
            }
        )
    return rows


def median_rows(rounds: list[list[dict[str, Any]]], key: str) -> list[dict[str, Any]]:
    """Per row position: the first round's fields, numbers replaced by their median (+spread)."""
    out = []
    for rows in zip(*rounds, strict=True):
        row = dict(rows[0])
        for field, value in rows[0].items():
            if field != key and isinstance(value, (int, float)):
                values = [float(r[field]) for r in rows]
                row[field] = statistics.median(values)
                row[f"{field}_spread"] = spread(values)
        row.pop("answer", None)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="mmserve bench video", description=__doc__)
    parser.add_argument("--model", default="tiny-qwen2-vl-small")
    parser.add_argument("--chat-frames", type=int, default=32)
    parser.add_argument(
        "--frames", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 64]
    )
    parser.add_argument(
        "--size", type=lambda s: tuple(int(x) for x in s.split("x")), default=(336, 336)
    )
    parser.add_argument("--max-pixels", type=int, default=336 * 336)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    add_priority_arg(parser)
    args = parser.parse_args(argv)
    priority = apply_priority(args)
    engine_kwargs: dict[str, Any] = {"seed": 0, "processor_kwargs": {"max_pixels": args.max_pixels}}
    probe = LLM(args.model, **engine_kwargs)
    floor = probe.engine.config.model.max_tokens_per_video_group
    del probe
    engine_kwargs["max_num_encoder_input_tokens"] = floor
    chats, memories = [], []
    for _ in tqdm(range(args.rounds), desc="rounds"):
        chats.append(chat_round(args, engine_kwargs))
        memories.append(memory_round(args, engine_kwargs))
    chat, memory = median_rows(chats, "turn"), median_rows(memories, "frames")
    base = memory[0]
    for row in memory:
        row["working_set_vs_first"] = row["working_set_mib"] / base["working_set_mib"]
    print(f"\nencoder budget per step: {floor} embeddings (the largest possible frame group)")
    print(
        markdown_table(chat, ["turn", "prompt_tokens", "groups_encoded", "ttft_s", "admission_s"])
    )
    columns = ["frames", "groups_encoded", "encoder_calls", "working_set_mib"]
    columns += ["working_set_vs_first", "whole_video_io_mib", "rss_peak_mib", "ttft_s"]
    print(markdown_table(memory, columns))
    payload = {
        "args": {k: v for k, v in vars(args).items()},
        "encoder_budget": floor,
        "chat": chat,
        "memory": memory,
        "rounds": {"chat": chats, "memory": memories},
        "priority": priority,
        "versions": engine_versions(),
    }
    print(f"saved {save('video', args.out, payload)}")
    return payload
