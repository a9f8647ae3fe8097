"""Decode graphs end to end: greedy tokens with the padded fixed-shape decode path equal the
eager engine's (float32, batches that need padding), padding rows write only the pad block,
and a failure (capture or replay) costs speed, never the step. ``--device cuda`` (or a CUDA
machine) runs the same checks with captured graphs."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.engine.setup.graph_setup import build_decode_graphs
from mmserve.graph_config import DecodeGraphConfig
from mmserve.inputs import PromptInput
from mmserve.worker.cuda_graphs import DecodeGraphs
from tests.models.test_qwen2_vl import chat_prompt
from tests.support.engine import assert_no_leaks, engine_device

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LLAVA = "USER: <image>\nWhat is in the picture? ASSISTANT:"
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
]


def prompts(model: str, images: list, count: int) -> list[dict]:
    """Every other prompt with an image, the others text only (prefills differ in length)."""
    out = []
    for i in range(count):
        ims = [images[i % len(images)]] if i % 2 == 0 else []
        if model == "tiny-llava":
            text = LLAVA if ims else f"USER: Tell me story number {i}. ASSISTANT:"
        else:
            text = chat_prompt(len(ims), f"Question {i}?")
        out.append({"prompt": text, "images": ims})
    return out


def engine(model: str, device: str, enforce_eager: bool) -> LLM:
    torch.backends.cuda.matmul.allow_tf32 = False
    return LLM(model, device=device, dtype="float32", seed=0, enforce_eager=enforce_eager)


def record_buckets(llm: LLM) -> Counter:
    """Count the buckets the graphs run (wraps ``DecodeGraphs.run``)."""
    graphs = llm.engine.decode_graphs
    assert graphs is not None
    seen: Counter = Counter()
    run = graphs.run

    def counting(rows):
        seen[graphs.config.bucket(len(rows.req_ids), max(rows.seq_lens))] += 1
        return run(rows)

    graphs.run = counting  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["tiny-llava", "tiny-qwen2-vl"])
def test_greedy_tokens_equal_the_eager_engines_in_padded_batches(model, device, images) -> None:
    eager = engine(model, device, enforce_eager=True)
    assert eager.engine.decode_graphs is None
    graphs = engine(model, device, enforce_eager=False)
    assert graphs.engine.decode_graphs is not None
    if device == "cuda":  # captured: one graph per bucket
        config = graphs.engine.decode_graphs.config
        expected = len(config.batch_sizes) * len(config.context_sizes)
        assert graphs.engine.decode_graphs.num_graphs == expected
    buckets = record_buckets(graphs)
    for count, bucket in ((3, 4), (5, 8)):  # both need padding rows
        batch = prompts(model, images, count)
        want = [o.outputs[0].token_ids for o in eager.generate(batch, GREEDY, use_tqdm=False)]
        got = [o.outputs[0].token_ids for o in graphs.generate(batch, GREEDY, use_tqdm=False)]
        assert got == want
        # every decode step of the full batch ran the graphs, padded to the bucket
        steps = sum(n for (rows, _), n in buckets.items() if rows == bucket)
        assert steps == GREEDY.max_tokens - 1, buckets
    ran = graphs.engine.decode_graphs
    assert ran.enabled and ran.steps == sum(buckets.values())  # no replay fell back
    assert_no_leaks(graphs)


def test_padding_rows_write_only_the_pad_block(images) -> None:
    llm = LLM(
        "tiny-qwen2-vl", dtype="float32", enforce_eager=False, num_kv_blocks=64, max_model_len=1024
    )
    eng = llm.engine
    block_size = eng.config.cache.block_size
    pad = range(64 * block_size, 65 * block_size)  # the block past the scheduler's 64
    assert eng.kv_cache.keys[0].shape[0] == 65 * block_size
    for p in prompts("tiny-qwen2-vl", images, 3):
        eng.add_request(PromptInput(p["prompt"], p["images"]), GREEDY)
    graph_steps, pad_written = 0, False
    while eng.has_unfinished_requests():
        before = {r: s.num_computed_tokens for r, s in eng.runner.states.items()}
        cache = [t.clone() for t in eng.kv_cache.keys + eng.kv_cache.values]
        steps = eng.decode_graphs.steps
        eng.step()
        if eng.decode_graphs.steps == steps:
            continue  # an eager step (prefill)
        graph_steps += 1
        written = set()
        for req_id, start in before.items():
            state = eng.runner.states.get(req_id)
            if state is None:  # finished in this step: its slot came from its last table
                continue
            assert state.num_computed_tokens == start + 1
            written.add(
                int(state.block_table[start // block_size]) * block_size + start % block_size
            )
        for old, new in zip(cache, eng.kv_cache.keys + eng.kv_cache.values, strict=True):
            changed = set((old != new).flatten(1).any(1).nonzero().flatten().tolist())
            assert written <= changed
            assert changed - written <= set(pad), "a padding row wrote a real block"
            pad_written |= bool(changed & set(pad))
    assert graph_steps == GREEDY.max_tokens - 1 and pad_written


def test_a_failed_capture_is_one_warning_and_an_eager_engine(caplog, monkeypatch) -> None:
    llm = LLM("tiny-llava", dtype="float32", enforce_eager=True)
    eng = llm.engine
    config = DecodeGraphConfig((1, 2), (256,), eng.config.cache.block_size, capture=True)
    caplog.set_level(logging.INFO)
    blocks = eng.kv_cache.keys[0].shape[0] // eng.config.cache.block_size

    def mismatch(self, key) -> None:
        raise RuntimeError(f"graph {key} replays differently from eager")

    # on CUDA the first graph's check fails; on a CPU the capture itself (no CUDA)
    monkeypatch.setattr(DecodeGraphs, "_check", mismatch)
    graphs = build_decode_graphs(config, eng.model, eng.kv_cache, blocks - 1, eng.device)
    assert graphs is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "capture failed, decode runs eagerly" in warnings[0].message


def test_a_failing_replay_turns_the_graphs_off_and_the_step_runs_eagerly(images, caplog) -> None:
    batch = prompts("tiny-llava", images, 3)
    want = engine("tiny-llava", "cpu", True).generate(batch, GREEDY, use_tqdm=False)
    llm = engine("tiny-llava", "cpu", False)
    graphs = llm.engine.decode_graphs
    assert graphs is not None

    def broken(rows):
        raise RuntimeError("replay broke")

    graphs.run = broken  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING)
    got = llm.generate(batch, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert not graphs.enabled
    assert [r.message for r in caplog.records if "decode graphs: off" in r.message] == [
        "decode graphs: off, decode runs eagerly (RuntimeError: replay broke)"
    ]


def test_steps_that_are_not_decode_only_run_eagerly(images) -> None:
    """A step with a prefill in it, or a request past max_seq_len_to_capture, runs eagerly."""
    llm = LLM("tiny-llava", dtype="float32", enforce_eager=False, max_seq_len_to_capture=40)
    graphs = llm.engine.decode_graphs
    assert graphs is not None and graphs.config.context_sizes == (48,)
    short = "USER: Hi ASSISTANT:"  # a few tokens: decodes fit 48 positions
    llm.generate([short], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert graphs.steps == 3  # the prefill step eagerly, then 3 decode steps
    long = "USER: " + "word " * 60 + "ASSISTANT:"
    llm.generate([long], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert graphs.steps == 3  # past 48 tokens: eager


@pytest.mark.skipif(engine_device() != "cpu", reason="the CPU's default")
def test_cpu_defaults_to_eager() -> None:
    assert LLM("tiny-llava").engine.decode_graphs is None


class FakeCuda:
    """torch.cuda's graph API on the CPU: a graph "captures" the ``_forward`` call made inside
    its ``torch.cuda.graph`` block and replays it by calling it again. Records what capture()
    asked for (pools, streams, order)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.recording: FakeCuda.Graph | None = None
        self.captures: list[tuple[object, object, tuple[int, int]]] = []
        fake = self
        forward = DecodeGraphs._forward

        class Graph:
            def __init__(self) -> None:
                self.call: tuple[DecodeGraphs, int, int] | None = None

            def replay(self) -> None:
                assert self.call is not None
                forward(*self.call)

        class GraphContext:
            def __init__(self, graph: Graph, pool: object = None, stream: object = None) -> None:
                self.graph, self.pool, self.stream = graph, pool, stream

            def __enter__(self) -> None:
                fake.recording = self.graph

            def __exit__(self, *exc: object) -> None:
                fake.recording = None
                assert self.graph.call is not None
                fake.captures.append((self.pool, self.stream, self.graph.call[1:]))

        def recording_forward(graphs: DecodeGraphs, count: int, context: int) -> None:
            if fake.recording is not None:
                fake.recording.call = (graphs, count, context)
            forward(graphs, count, context)

        self.Graph = Graph
        monkeypatch.setattr(DecodeGraphs, "_forward", recording_forward)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", GraphContext)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
        monkeypatch.setattr(torch.cuda, "Stream", lambda device: "stream")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_capture_runs_largest_first_into_one_pool_and_the_engine_decodes_on_it(
    images, monkeypatch
) -> None:
    if engine_device() != "cpu":
        pytest.skip("fakes torch.cuda's graph API on the CPU")
    fake = FakeCuda(monkeypatch)
    eager = engine("tiny-qwen2-vl", "cpu", True)
    llm = engine("tiny-qwen2-vl", "cpu", False)
    eng = llm.engine
    config = DecodeGraphConfig((1, 2, 4), (256, 512), eng.config.cache.block_size, capture=True)
    pad = eng.kv_cache.keys[0].shape[0] // eng.config.cache.block_size - 1
    graphs = build_decode_graphs(config, eng.model, eng.kv_cache, pad, eng.device)
    assert graphs is not None and graphs.num_graphs == 6
    keys = [key for _, _, key in fake.captures]
    assert keys == [(4, 512), (4, 256), (2, 512), (2, 256), (1, 512), (1, 256)]  # by size
    assert {(pool, stream) for pool, stream, _ in fake.captures} == {("pool", "stream")}
    eng.decode_graphs = graphs
    eng.runner.graphs = graphs
    batch = prompts("tiny-qwen2-vl", images, 3)
    want = [o.outputs[0].token_ids for o in eager.generate(batch, GREEDY, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in llm.generate(batch, GREEDY, use_tqdm=False)]
    assert got == want and graphs.steps == GREEDY.max_tokens - 1 and graphs.enabled
