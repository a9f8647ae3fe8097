"""Differential fuzz (issue 11): random workloads under stressed configs give the plain
engine's tokens, keep every invariant after every step and leak nothing. ``--fuzz-seeds N``
runs seeds 0..N-1 (default: a short range)."""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from mmserve import LLM, SamplingParams
from mmserve.core.kv_cache_manager import cdiv
from mmserve.engine.loop.llm_engine import LLMEngine
from mmserve.engine.setup.loading import build_model_config
from mmserve.inputs import PromptInput
from tests.support.images import make_image

# ---- the harness: random workloads, the plain engine's answers, injected faults ----------
QWEN_PIXELS = {"max_pixels": 28 * 28 * 100, "min_pixels": 28 * 28 * 4}  # 4..100 embeddings
QWEN3_PIXELS = {"max_pixels": 32 * 32 * 100, "min_pixels": 32 * 32 * 4}  # 4..100 embeddings
MODELS: dict[str, dict[str, Any]] = {
    "tiny-llava": {"max_model_len": 1024, "processor_kwargs": None},
    "tiny-qwen2-vl": {"max_model_len": 512, "processor_kwargs": QWEN_PIXELS},
    # DeepStack rows sliced at every chunk, prefix-hit and preemption boundary
    "tiny-qwen3-vl": {"max_model_len": 512, "processor_kwargs": QWEN3_PIXELS},
    # images never split across chunks, bidirectional within an image, sliding window 8
    "tiny-gemma3": {"max_model_len": 512, "processor_kwargs": None},
}
POISON = Image.new("RGB", (64, 64), (200, 30, 30))  # a flat image the fault injector rejects


COOLDOWN = 40


class InjectedFault(RuntimeError):
    pass


@functools.cache
def max_tokens_per_image(model: str) -> int:
    """The largest item the engine must hold: an image, or a video frame group where the
    model takes videos (the budget floor counts both, even though the fuzz sends images)."""
    spec = MODELS[model]
    config = build_model_config(model, "float32", spec["max_model_len"], spec["processor_kwargs"])
    return max(config.max_tokens_per_image, config.max_tokens_per_video_group)


@functools.cache  # the same objects every seed: PlainOutputs memoizes by image identity
def image_pool(model: str) -> list[Image.Image]:
    sizes = [(96, 80), (64, 64), (120, 50), (70, 90)]
    if model != "tiny-llava":
        sizes = [(252, 252), (112, 168), (280, 140), (56, 84)]
    return [make_image(10 + i, size) for i, size in enumerate(sizes)]


def placeholder(model: str) -> str:
    if model == "tiny-gemma3":
        return "<start_of_image>"
    return "<image>" if model == "tiny-llava" else "<|vision_start|><|image_pad|><|vision_end|>"


@dataclass
class FuzzRequest:
    prompt: str
    images: list[Image.Image]
    max_tokens: int
    arrival_step: int
    abort_step: int | None = None

    @property
    def poisoned(self) -> bool:
        return any(image is POISON for image in self.images)


@dataclass
class Workload:
    model: str
    engine_args: dict[str, Any]
    requests: list[FuzzRequest]
    fail_calls: set[int] = field(default_factory=set)  # which model calls raise (transient)


def random_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    model = rng.choice(sorted(MODELS))
    pool = image_pool(model)
    per_image = max_tokens_per_image(model)
    max_images = 3 if model == "tiny-llava" else 4  # so every prompt fits max_model_len
    requests: list[FuzzRequest] = []
    for i in range(rng.randint(2, 6)):
        if requests and rng.random() < 0.35:  # next turn of an earlier chat: shared prefix
            base = rng.choice(requests)
            prompt, images = base.prompt + f" ok{i}. USER: ", list(base.images)
        else:
            prompt, images = rng.choice(["USER: ", "", "Look: "]), []
        for _ in range(min(rng.randint(0, 3), max_images - len(images))):
            image = rng.choice(pool + images) if images and rng.random() < 0.4 else rng.choice(pool)
            images.append(image)
            prompt += placeholder(model) + rng.choice(["\n", " and ", ""])
        prompt += rng.choice(["What is it?", "Compare", "", "Describe the colors."])
        if not prompt.strip():
            prompt = "Hello"
        requests.append(
            FuzzRequest(
                prompt + " ASSISTANT:",
                images,
                rng.randint(1, 8),
                rng.choice([0, 0, 0, rng.randint(1, 12)]),
            )
        )
    if rng.random() < 0.15:
        victim = rng.choice(requests)
        if len(victim.images) == max_images:
            victim.images.pop()
            victim.prompt = victim.prompt[::-1].replace(placeholder(model)[::-1], "", 1)[::-1]
        victim.images.insert(0, POISON)
        victim.prompt = placeholder(model) + victim.prompt
    if rng.random() < 0.3:
        rng.choice(requests).abort_step = rng.randint(1, 15)
    max_len = MODELS[model]["max_model_len"]
    block_size = rng.choice([8, 16, 32])
    budget = rng.choice([32, 64, 100, 128, 256, 512])
    args: dict[str, Any] = {
        "max_model_len": max_len,
        "block_size": block_size,
        "num_kv_blocks": cdiv(max_len, block_size) + rng.choice([0, 4, 16, 64]),
        "max_num_batched_tokens": budget,
        "max_num_seqs": rng.randint(1, 6),
        "enable_prefix_caching": rng.random() < 0.7,
        "enable_encoder_cache": rng.random() < 0.7,
        "disable_chunked_mm_input": budget >= per_image and rng.random() < 0.2,
        "encoder_cache_size": rng.choice([None, per_image, per_image + 50, 3 * per_image]),
        "max_num_encoder_input_tokens": rng.choice([None, per_image, 2 * per_image]),
        "processor_kwargs": MODELS[model]["processor_kwargs"],
    }
    if rng.random() < 0.25:  # squeezed: preemptions that release images others planned to hit
        args.update(
            num_kv_blocks=cdiv(max_len, block_size),
            max_num_seqs=6,
            enable_encoder_cache=False,
            encoder_cache_size=None,
        )
    fail_calls = {c for c in range(400) if rng.random() < 0.03}
    return Workload(model, args, requests, fail_calls)


def inject_faults(engine: LLMEngine, fail_calls: set[int]) -> None:
    """Poisoned images always make the encoder raise; the listed calls (to the encoder or the
    language model, counted together) raise once each, unless a fault fired in the previous
    ``COOLDOWN`` calls (a transient fault: the bisecting retries after it find a healthy model)."""
    model = engine.model
    # the admission memo hands out this very object for every later use of POISON
    poison = engine.intake.process(PromptInput(placeholder(engine.config.model.model), [POISON]))
    poison_data = poison.mm_items[0].data
    real_encode, real_forward = model.encode_images, model.forward
    calls = Counter[str](last_fault=-COOLDOWN - 1)

    def maybe_fail(where: str) -> None:
        calls["all"] += 1
        call = calls["all"] - 1
        if call in fail_calls and call - calls["last_fault"] > COOLDOWN:
            calls["last_fault"] = call
            raise InjectedFault(f"injected transient fault in {where}")

    def encode(images):
        if any(d is poison_data for d in images):
            raise InjectedFault("injected: the vision tower rejects this image")
        maybe_fail("the encoder")
        return real_encode(images)

    def forward(*args, **kwargs):
        maybe_fail("the language model")
        return real_forward(*args, **kwargs)

    model.encode_images = encode
    model.forward = forward


class PlainOutputs:
    """Greedy outputs of the plain engine per model, computed once per distinct request."""

    def __init__(self) -> None:
        self.engines: dict[str, LLM] = {}
        self.memo: dict[tuple, list[int]] = {}

    def get(self, model: str, request: FuzzRequest) -> list[int]:
        key = (model, request.prompt, tuple(id(i) for i in request.images), request.max_tokens)
        if key not in self.memo:
            if model not in self.engines:
                self.engines[model] = LLM(
                    model,
                    enable_prefix_caching=False,
                    enable_encoder_cache=False,
                    max_num_batched_tokens=4096,
                    max_model_len=MODELS[model]["max_model_len"],
                    processor_kwargs=MODELS[model]["processor_kwargs"],
                )
            out = self.engines[model].generate(
                {"prompt": request.prompt, "images": request.images},
                params(request),
                use_tqdm=False,
            )[0]
            self.memo[key] = out.outputs[0].token_ids
        return self.memo[key]


def params(request: FuzzRequest) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=True)


# ---- the test -----------------------------------------------------------------------------
MAX_STEPS = 4000
_plain = PlainOutputs()


def check_invariants(engine: LLMEngine) -> None:
    sched = engine.scheduler
    live = set(sched.requests)
    assert {r.req_id for r in sched.running} | {r.req_id for r in sched.waiting} == live
    assert len(sched.running) + len(sched.waiting) == len(live)
    assert len(sched.running) <= sched.max_num_seqs
    pool = sched.kv.pool
    held = Counter(b.block_id for blocks in sched.kv.req_blocks.values() for b in blocks)
    assert all(pool.blocks[i].ref_cnt == n for i, n in held.items())
    assert sum(b.ref_cnt for b in pool.blocks) == sum(held.values())
    assert pool.num_free_blocks == sum(1 for b in pool.blocks if b.ref_cnt == 0)
    assert set(sched.kv.req_blocks) <= {r.req_id for r in sched.running}
    bs = sched.kv.block_size
    for request in sched.running:
        assert sched.kv.num_blocks_of(request.req_id) == -(-request.num_computed_tokens // bs)
    cache = sched.encoder_cache
    assert 0 <= cache.num_free and sum(cache.sizes.values()) == cache.capacity - cache.num_free
    assert set(cache.sizes) == set(cache.referenced) | set(cache.unreferenced)
    for request in sched.waiting:
        assert request.num_computed_tokens == 0 and request.req_id not in sched.kv.req_blocks
    for req_id, request in sched.requests.items():  # references are per occurrence in progress
        computed = request.num_computed_tokens
        in_progress = {it.key for it in request.mm_items if it.offset < computed < it.end}
        holding = {k for k, refs in cache.referenced.items() if req_id in refs}
        assert holding == in_progress, (req_id, holding, in_progress)
    worker = engine.runner.encoder
    assert set(cache.sizes) <= set(worker.embeddings)  # every entry was really encoded
    assert set(worker.embeddings) <= set(cache.sizes) | set(cache._freed)
    assert worker.num_gather_misses == 0


def run_workload(work: Workload) -> dict[str, object]:
    engine = LLMEngine.from_args(work.model, **work.engine_args)
    inject_faults(engine, work.fail_calls)
    pending = dict(enumerate(work.requests))
    ids: dict[str, int] = {}
    finished: dict[int, object] = {}
    aborted: set[int] = set()
    for step in range(MAX_STEPS):
        for idx, req in list(pending.items()):
            if req.arrival_step <= step:
                req_id = engine.add_request(PromptInput(req.prompt, req.images), params(req))
                ids[req_id] = idx
                del pending[idx]
        for req_id, idx in ids.items():
            req = work.requests[idx]
            if req.abort_step == step and idx not in finished and idx not in aborted:
                engine.abort_request([req_id])
                aborted.add(idx)
        if not pending and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                finished[ids[out.request_id]] = out
        check_invariants(engine)
    else:
        raise AssertionError(f"workload not finished after {MAX_STEPS} steps")
    metrics = engine.get_metrics()
    assert metrics["kv_blocks_used"] == 0 and metrics["encoder_cache_references"] == 0, metrics
    engine.step()  # hands the last ended requests and evictions to the worker
    assert not engine.runner.states and not engine.runner._parked_generators
    for idx, req in enumerate(work.requests):
        if idx in aborted and idx not in finished:
            continue
        out = finished[idx]
        reason = out.outputs[0].finish_reason
        if req.poisoned:
            assert reason == "error" and "rejects this image" in out.error, (idx, reason)
            continue
        assert reason == "length", (idx, reason, out.error)
        assert out.outputs[0].token_ids == _plain.get(work.model, req), (idx, work.engine_args)
    return metrics


def test_fuzz(fuzz_seed: int) -> None:
    run_workload(random_workload(fuzz_seed))
