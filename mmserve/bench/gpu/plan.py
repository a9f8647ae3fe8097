"""What a GPU run does, and its CPU dry run: one ``Profile`` each (models, counts, time boxes),
and the ordered ``Stage`` list both run through the same code. Stdlib only: the supervising
process never imports torch.

Stages, in order: ``env`` (versions, device), ``build`` (the presets, timed), ``limits``
(bandwidth, matmul rate), ``parity:<model>`` (float32 token identity, bfloat16 closeness with
transformers on the same device), ``bench:<model>`` (load, TTFT, decode, multi-turn, reuse;
mmserve and transformers), ``profile:<model>`` (where a decode step and a chat turn spend
their time, from ``torch.profiler``: ``profiling.py``), ``pytest`` (a selection of the suite
with ``--device``). Each has a time box; the run has a budget, and a stage that would start
past it is skipped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

QWEN2_VL_2B = "shape:Qwen2-VL-2B-Instruct"
QWEN2_5_VL_3B = "shape:Qwen2.5-VL-3B-Instruct"
CHILD_KINDS = ("env", "build", "limits", "parity", "bench", "profile")  # run in the engine process
KINDS = (*CHILD_KINDS, "pytest")  # pytest runs as its own process


@dataclass(frozen=True)
class Profile:
    """Everything a run's stages read: JSON-able, passed to the engine process as is."""

    mode: str  # "gpu" or "dry-run"
    device: str
    models: tuple[str, ...]  # benchmarked in bench_dtype
    bench_dtype: str  # bfloat16 on the GPU; float32 on CPUs that only emulate bfloat16
    parity_models: tuple[str, ...]
    pytest_args: tuple[str, ...]
    resolution: tuple[int, int]  # benchmark images (width, height)
    ttft_repeats: int
    decode_tokens: int
    decode_batches: tuple[int, ...]
    turns: int
    answer_tokens: int
    reuse_requests: int
    reuse_fractions: tuple[float, ...]
    parity_tokens: int
    copy_bytes: int
    matmul_size: int
    max_model_len: int
    gpu_memory_utilization: float  # on CUDA; the CPU gets kv_cache_memory
    kv_cache_memory: int
    budget_s: float
    boxes: dict[str, float] = field(default_factory=dict)  # seconds per stage kind
    enforce_eager: bool = False  # mmserve's decode graphs on (captured on CUDA, static on CPU)
    profile_models: tuple[str, ...] = ()  # profiled (the profile stage), in bench_dtype
    profile_tokens: int = 16  # decode steps each profiled decode runs

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        tuples = {f.name for f in dataclasses.fields(cls) if str(f.type).startswith("tuple")}
        values: dict[str, Any] = {k: tuple(v) if k in tuples else v for k, v in data.items()}
        return cls(**values)


GPU = Profile(
    mode="gpu",
    device="cuda",
    models=(QWEN2_VL_2B, QWEN2_5_VL_3B),
    bench_dtype="bfloat16",
    parity_models=(QWEN2_VL_2B,),
    pytest_args=(
        "tests/engine/test_cuda.py",
        "tests/engine/test_engine_parity.py",
        "tests/models/test_bf16_closeness.py",
        "tests/layers/test_attention_flex.py",
        "tests/worker/test_decode_graphs.py",
        "--device",
        "cuda",
    ),
    resolution=(1280, 720),
    ttft_repeats=3,
    decode_tokens=64,
    decode_batches=(1, 32),
    turns=4,
    answer_tokens=16,
    reuse_requests=24,
    reuse_fractions=(0.0, 0.3),
    parity_tokens=16,
    copy_bytes=1 << 30,
    matmul_size=8192,
    max_model_len=8192,
    gpu_memory_utilization=0.4,  # leaves room for the transformers model beside a freed engine
    kv_cache_memory=1 << 30,
    budget_s=420.0,
    boxes={
        "env": 60,
        "build": 150,
        "limits": 30,
        "parity": 100,
        "bench": 130,
        "profile": 60,
        "pytest": 150,
    },
    profile_models=(QWEN2_VL_2B,),
)

DRY_RUN = dataclasses.replace(
    GPU,
    mode="dry-run",
    device="cpu",
    models=("tiny-qwen2-vl",),
    bench_dtype="float32",
    parity_models=("tiny-qwen2-vl",),
    pytest_args=("tests/bench/test_closeness.py", "--device", "cpu"),
    resolution=(160, 120),
    ttft_repeats=2,
    decode_tokens=6,
    decode_batches=(1, 4),
    turns=2,
    answer_tokens=4,
    reuse_requests=5,  # one repeat among them
    parity_tokens=6,
    copy_bytes=16 << 20,
    matmul_size=256,
    max_model_len=2048,
    kv_cache_memory=256 << 20,
    # its work takes about a minute on a quiet 2-core machine; the boxes are safety caps for
    # slow, shared CI machines, not targets
    budget_s=900.0,
    boxes={
        "env": 180,
        "build": 120,
        "limits": 60,
        "parity": 180,
        "bench": 300,
        "profile": 180,
        "pytest": 240,
    },
    profile_models=("tiny-qwen2-vl",),
    profile_tokens=4,
)


@dataclass(frozen=True)
class Stage:
    """One step of the run: ``name`` is ``kind`` or ``kind:model``."""

    kind: str
    box_s: float
    model: str | None = None

    @property
    def name(self) -> str:
        return self.kind if self.model is None else f"{self.kind}:{self.model}"


def stages(profile: Profile) -> list[Stage]:
    """The run's stages in order (see the module doc)."""
    box = profile.boxes
    out = [Stage(kind, box[kind]) for kind in ("env", "build", "limits")]
    out += [Stage("parity", box["parity"], m) for m in profile.parity_models]
    out += [Stage("bench", box["bench"], m) for m in profile.models]
    out += [Stage("profile", box["profile"], m) for m in profile.profile_models]
    return out + [Stage("pytest", box["pytest"])]


def select(all_stages: list[Stage], only: str | None) -> list[Stage]:
    """The stages whose kind or name is in the comma list ``only`` (all when None); an
    unknown entry is a ValueError naming the valid ones."""
    if not only:
        return all_stages
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = {s.name for s in all_stages} | {s.kind for s in all_stages}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(f"--only: unknown stage(s) {unknown}; valid: {sorted(names)}")
    return [s for s in all_stages if s.name in wanted or s.kind in wanted]
