"""The bench stage of one model, in the profile's ``bench_dtype``: mmserve first, then
transformers ``generate`` on the same device (one engine in memory at a time), each measured
on:

- ``load_s``: engine construction to its first token, in a process whose device is already
  initialised (the env and limits stages ran first);
- ``ttft_s``: one chat request about a new image, from the call (preprocessing included) to
  the first token; median of ``ttft_repeats``, after a warm-up request;
- ``decode_b{B}_tok_s``: B copies of a text prompt, ``decode_tokens`` tokens each: tokens after
  the first over the time after the last first token; mmserve with its decode graphs (CUDA
  graphs; on CPU the padded static path), then ``decode_b{B}_eager_tok_s`` on the same
  engine without them, and ``cuda_graphs`` (``graph_record``: mode, count, capture seconds,
  and ``decode_steps``, the steps they ran during the decode measurement);
- ``multiturn_ttft_s``: TTFT of each turn of one chat that adds a new image per turn
  (``bench multiturn``'s conversation);
- ``followup_ttft_s``: the same for a chat about one image (turn 1's), text questions after;
  both chats with ``*_images_encoded``, ``*_prompt_tokens`` and ``*_cached_tokens``
  (prefix-cache hits) per turn, as vLLM's side records them;
- ``reuse_{P}_req_s``: ``reuse_requests`` requests submitted at once, P % repeating an earlier
  image and prefix (``bench reuse``'s workload; transformers serves them one by one).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from mmserve import LLM, SamplingParams
from mmserve.bench.gpu.engines import (
    eager_decode,
    graph_record,
    image_requests,
    mmserve_engine,
    parameter_counts,
    reference,
    release,
    text_prompt,
    workload,
)
from mmserve.bench.gpu.plan import Profile
from mmserve.bench.lib.engines.reference import HFReference
from mmserve.bench.lib.engines.runners import MmserveRunner, TransformersRunner, run_transformers
from mmserve.bench.lib.workloads import reuse_specs
from mmserve.bench.multiturn.conversation import run_conversation
from mmserve.bench.reuse.engines import run_mmserve
from mmserve.bench.reuse.workload import Workload

WARMUP_RUN, TTFT_RUN, TURNS_SEED, REUSE_RUN = 21, 22, 230_000, 24  # image seeds of their own
FOLLOWUP_SEED = 240_000


def _decode_rate(batch: int, tokens: int, last_first_token: float, end: float) -> float:
    return batch * (tokens - 1) / max(end - last_first_token, 1e-9)


def _decode(llm: LLM, profile: Profile, prompt: str, suffix: str = "") -> dict[str, float]:
    params = SamplingParams(temperature=0, max_tokens=profile.decode_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    out = {}
    for batch in profile.decode_batches:
        llm.generate([prompt] * batch, warm, use_tqdm=False)  # first-call costs of the shapes
        outs = llm.generate([prompt] * batch, params, use_tqdm=False)
        end = time.monotonic()
        first = max(o.metrics["first_token_time"] for o in outs)
        rate = _decode_rate(batch, profile.decode_tokens, first, end)
        out[f"decode_b{batch}{suffix}_tok_s"] = rate
    return out


def measure_mmserve(
    profile: Profile, model: str, work: Workload, started: float | None = None
) -> dict[str, Any]:
    """mmserve's numbers (module doc); ``load_s`` counts from ``started`` (``time.time()``,
    e.g. the process's start) when given, else from the engine's construction."""
    start = time.time() if started is None else started
    llm = mmserve_engine(profile, model, profile.bench_dtype)
    llm.generate(text_prompt(work), SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    out: dict[str, Any] = {"load_s": time.time() - start}
    warm = image_requests(work, 2, WARMUP_RUN)
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    ttft = run_mmserve(llm, image_requests(work, profile.ttft_repeats, TTFT_RUN), 1, "sequential")
    out["ttft_s"] = statistics.median(ttft["ttfts"])
    out["ttft_all_s"] = ttft["ttfts"]
    prompt = text_prompt(work)
    graphs = graph_record(llm)
    out.update(_decode(llm, profile, prompt))
    graphs["decode_steps"] = graph_record(llm)["steps"] - graphs.pop("steps")
    out["cuda_graphs"] = graphs
    with eager_decode(llm) as had_graphs:
        if had_graphs:
            out.update(_decode(llm, profile, prompt, "_eager"))
    out.update(_multiturn(MmserveRunner.wrapping(llm), profile))
    out.update(_reuse(llm, work, profile))
    one = llm.generate(
        image_requests(work, 1, TTFT_RUN)[0], SamplingParams(max_tokens=1), use_tqdm=False
    )
    out["prompt_tokens_one_image"] = len(one[0].prompt_token_ids)
    return out


def measure_transformers(
    profile: Profile, model: str, work: Workload, started: float | None = None, reuse: bool = True
) -> dict[str, Any]:
    """transformers' numbers, as ``measure_mmserve``'s; ``reuse=False`` leaves out the reuse
    runs (served one by one, they take R times a request)."""
    start = time.time() if started is None else started
    ref = reference(profile, model, profile.bench_dtype)
    ref.generate(ref.inputs(text_prompt(work), []), 1, time.monotonic)
    out: dict[str, Any] = {"load_s": time.time() - start}
    run_transformers(ref, image_requests(work, 1, WARMUP_RUN), 2, "sequential")
    ttft = run_transformers(
        ref, image_requests(work, profile.ttft_repeats, TTFT_RUN), 1, "sequential"
    )
    out["ttft_s"] = statistics.median(ttft["ttfts"])
    out["ttft_all_s"] = ttft["ttfts"]
    text = ref.inputs(text_prompt(work), [])
    for batch in profile.decode_batches:
        inputs = {k: v.repeat(batch, 1) for k, v in text.items()}  # equal lengths: no padding
        _, first = ref.generate(inputs, profile.decode_tokens, time.monotonic)
        end = time.monotonic()
        out[f"decode_b{batch}_tok_s"] = _decode_rate(
            batch, profile.decode_tokens, first or end, end
        )
    out.update(_multiturn(TransformersRunner.wrapping(ref), profile))
    if reuse:
        out.update(_reuse(ref, work, profile))
    return out


def _multiturn(runner: Any, profile: Profile) -> dict[str, Any]:
    """Both chats: a new image every turn (``multiturn_*``), then one image and text follow-ups
    (``followup_*``)."""
    out: dict[str, Any] = {}
    for prefix, seed, new_images in (
        ("multiturn", TURNS_SEED, True),
        ("followup", FOLLOWUP_SEED, False),
    ):
        rows = run_conversation(
            runner, profile.turns, profile.resolution, profile.answer_tokens, seed, new_images
        )
        out[f"{prefix}_ttft_s"] = [r["ttft_s"] for r in rows]
        out[f"{prefix}_images_encoded"] = [r["images_encoded"] for r in rows]
        out[f"{prefix}_cached_tokens"] = [r["cached_tokens"] for r in rows]
        out[f"{prefix}_prompt_tokens"] = [r["prompt_tokens"] for r in rows]
    return out


def _reuse(engine: LLM | HFReference, work: Workload, profile: Profile) -> dict[str, Any]:
    """Each reuse fraction's requests, all submitted at once (transformers: one by one)."""
    out: dict[str, Any] = {}
    for k, fraction in enumerate(profile.reuse_fractions):
        specs = reuse_specs(
            profile.reuse_requests, fraction, grouped=False, seed=0, run=REUSE_RUN + k
        )
        requests = work.requests(specs)
        if isinstance(engine, HFReference):
            result = run_transformers(engine, requests, profile.answer_tokens, "all")
        else:
            result = run_mmserve(engine, requests, profile.answer_tokens, "all")
        pct = round(fraction * 100)
        out[f"reuse_{pct}_req_s"] = profile.reuse_requests / result["wall_s"]
        out[f"reuse_{pct}_images_encoded"] = result["images_encoded"]
    return out


def bench_model(profile: Profile, model: str) -> dict[str, Any]:
    """The stage's result: both engines' numbers, the parameter counts the limits use."""
    work = workload(profile, model)
    result: dict[str, Any] = {"dtype": profile.bench_dtype, **parameter_counts(model)}
    result["mmserve"] = measure_mmserve(profile, model, work)
    release(profile.device)
    result["transformers"] = measure_transformers(profile, model, work)
    release(profile.device)
    return result
