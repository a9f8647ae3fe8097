"""The ``profile:<model>`` stage of a GPU run: where the time goes in what the bench stage left
unexplained (benchmarks/README, "GPU runs"): a batch-1 decode without the decode graphs and
with them, and the second turn of a chat that adds an image every turn.

Each part runs under ``torch.profiler`` (the CPU's activity and, on CUDA, the device's) and
keeps its wall time, its count of host syncs and its operators with the most self time on each
side. A sync is a call that waits for the device: ``aten::_local_scalar_dense`` (``.item()``,
``.tolist()`` of a device tensor) and the CUDA runtime's synchronize and memcpy calls. The
decode parts' wall time includes the prefill of their short text prompt (one step of
``profile.profile_tokens``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mmserve import SamplingParams
from mmserve.bench.gpu.engines import eager_decode, mmserve_engine, text_prompt
from mmserve.bench.gpu.limits import synchronize
from mmserve.bench.gpu.plan import Profile
from mmserve.bench.lib.engines.runners import MmserveRunner, TurnResult
from mmserve.bench.multiturn.conversation import run_conversation
from mmserve.bench.reuse.workload import Workload

TOP_OPS = 8
SYNC_OPS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")
PROFILED_TURN = 2
CHAT_SEED = 250_000  # images no other stage sends


def profile_model(profile: Profile, model: str) -> dict[str, Any]:
    """The stage's record (module doc): ``decode_b1_eager``, ``decode_b1_graphs`` (when the
    engine has decode graphs), ``chat_turn2``, and every chat turn's TTFT and counts."""
    llm = mmserve_engine(profile, model, profile.bench_dtype)
    work = Workload(model, profile.resolution)
    prompt = text_prompt(work)
    steps = profile.profile_tokens
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)

    def decode() -> None:
        llm.generate([prompt], params, use_tqdm=False)

    decode()  # first-call costs of the decode shapes
    out: dict[str, Any] = {"decode_steps": steps}
    with eager_decode(llm) as had_graphs:
        decode()
        out["decode_b1_eager"] = profiled(profile.device, decode, steps)
    if had_graphs:
        out["decode_b1_graphs"] = profiled(profile.device, decode, steps)
    runner = ProfiledTurn(MmserveRunner.wrapping(llm), PROFILED_TURN, profile.device)
    rows = run_conversation(
        runner, max(profile.turns, PROFILED_TURN), profile.resolution, profile.answer_tokens,
        CHAT_SEED,
    )  # fmt: skip
    out[f"chat_turn{PROFILED_TURN}"] = runner.record
    out["chat_turns"] = [
        {k: row[k] for k in ("turn", "ttft_s", "encoder_s", "prompt_tokens", "cached_tokens")}
        for row in rows
    ]
    return out


class ProfiledTurn:
    """A chat runner that profiles one turn (1-based) of the runner it wraps."""

    def __init__(self, runner: MmserveRunner, turn: int, device: str) -> None:
        self.runner, self.turn, self.device = runner, turn, device
        self.name = runner.name
        self.turns_done = 0
        self.record: dict[str, Any] = {}

    def chat_turn(self, messages: list[dict], answer_tokens: int) -> TurnResult:
        self.turns_done += 1
        if self.turns_done != self.turn:
            return self.runner.chat_turn(messages, answer_tokens)
        result: list[TurnResult] = []
        self.record = profiled(
            self.device, lambda: result.append(self.runner.chat_turn(messages, answer_tokens))
        )
        return result[0]


def profiled(device: str, work: Callable[[], Any], steps: int = 1) -> dict[str, Any]:
    """``work`` under the profiler: its wall time (and per step), host syncs, top operators."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        work()
        synchronize(device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    syncs = {e.key: e.count for e in events if e.key in SYNC_OPS or e.key.startswith("cudaMemcpy")}
    return {
        "wall_s": wall,
        "wall_per_step_s": wall / steps,
        "syncs": syncs,
        "top_cpu": _top(events, "self_cpu_time_total"),
        "top_device": _top(events, "self_device_time_total") if len(activities) > 1 else [],
    }


def _top(events: Any, attribute: str) -> list[dict[str, Any]]:
    """The operators with the most of ``attribute`` (microseconds): name, calls, ms."""
    rows = [(getattr(e, attribute, 0) or 0, e) for e in events]
    rows.sort(key=lambda r: r[0], reverse=True)
    return [
        {"op": e.key[:80], "calls": e.count, "ms": round(t / 1000, 3)}
        for t, e in rows[:TOP_OPS]
        if t > 0
    ]
