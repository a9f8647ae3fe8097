"""Device selection, dtype auto, and the CUDA memory plan on fake device-memory figures."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mmserve.engine.setup.device import resolve_device
from mmserve.engine.setup.loading import create_engine_config
from mmserve.engine.setup.memory_plan import DeviceMemoryUsage, MemoryPlan
from mmserve.engine.setup.memory_profile import num_kv_blocks, profile_memory
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.llm import LLM
from mmserve.graph_config import DecodeGraphConfig
from mmserve.sampling_params import SamplingParams
from mmserve.worker.cuda_graphs import DecodeGraphs

GiB, MiB = 1 << 30, 1 << 20


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_is_cuda_when_torch_sees_a_gpu_and_cpu_otherwise(monkeypatch) -> None:
    fake_cuda(monkeypatch, 0)
    assert resolve_device("auto") == "cpu"
    fake_cuda(monkeypatch, 2)
    assert resolve_device("auto") == "cuda:0"
    assert resolve_device("cuda") == "cuda:0"
    assert resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize(
    ("count", "requested", "message"),
    [(0, "cuda", "no CUDA device"), (0, "cuda:0", "no CUDA device"),
     (1, "cuda:1", "only 1 CUDA device"), (1, "gpu", "auto, cpu, cuda or cuda:N"),
     (1, "cuda:x", "auto, cpu, cuda or cuda:N")],
)  # fmt: skip
def test_a_device_that_is_not_there_is_a_value_error_naming_it(
    monkeypatch, count: int, requested: str, message: str
) -> None:
    fake_cuda(monkeypatch, count)
    with pytest.raises(ValueError, match=message) as err:
        resolve_device(requested)
    assert repr(requested) in str(err.value)


def test_engine_args_check_the_syntax_and_take_the_env_default(monkeypatch) -> None:
    with pytest.raises(ValueError, match="'tpu'"):
        EngineArgs(device="tpu")
    monkeypatch.setenv("MMSERVE_DEVICE", "cuda:1")
    monkeypatch.setenv("MMSERVE_DTYPE", "float16")
    args = EngineArgs()
    assert (args.device, args.dtype) == ("cuda:1", "float16")
    monkeypatch.delenv("MMSERVE_DEVICE")
    monkeypatch.delenv("MMSERVE_DTYPE")
    assert (EngineArgs().device, EngineArgs().dtype) == ("auto", "auto")


def test_auto_resolves_at_config_time_with_the_dtype_of_that_device(monkeypatch) -> None:
    monkeypatch.delenv("MMSERVE_DEVICE", raising=False)
    fake_cuda(monkeypatch, 0)
    config = create_engine_config(EngineArgs(model="tiny-llava", device="auto"))
    assert (config.device, config.model.dtype) == ("cpu", "float32")
    fake_cuda(monkeypatch, 1)  # the config only: nothing is put on the (absent) device
    config = create_engine_config(EngineArgs(model="tiny-llava", device="auto"))
    assert (config.device, config.model.dtype) == ("cuda:0", "bfloat16")
    assert config.gpu_memory_utilization == 0.9


def test_llm_on_auto_runs_on_the_cpu_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto picks it")
    llm = LLM("tiny-llava", device="auto", max_model_len=128)
    assert llm.engine.device == torch.device("cpu")
    assert llm.generate("a b c", SamplingParams(max_tokens=2))[0].outputs[0].token_ids


USAGE = DeviceMemoryUsage(total=80 * GiB, used_elsewhere=1 * GiB, weights=16 * GiB,
                          peak_activations=4 * GiB)  # fmt: skip


def test_the_kv_cache_gets_what_the_budget_leaves_in_whole_blocks() -> None:
    plan = MemoryPlan.of(USAGE, 0.9, 1 * GiB, bytes_per_block=3 * MiB, wanted_blocks=10**9)
    budget = int(80 * GiB * 0.9)
    left = budget - (1 + 16 + 4 + 1) * GiB
    assert plan.num_kv_blocks == left // (3 * MiB)
    assert plan.kv_cache <= left < plan.kv_cache + 3 * MiB
    summary = plan.summary(block_size=16)
    for part in ("81920 MiB", "budget 73728 MiB", "weights 16384 MiB", "peak activations 4096",
                 "encoder cache 1024 MiB", f"{plan.num_kv_blocks} blocks"):  # fmt: skip
        assert part in summary


def test_the_plan_never_takes_more_blocks_than_the_sequences_need() -> None:
    plan = MemoryPlan.of(USAGE, 0.9, 0, bytes_per_block=MiB, wanted_blocks=1000)
    assert plan.num_kv_blocks == 1000


@pytest.mark.parametrize("utilization", [0.25, 0.2])
def test_a_budget_without_room_for_one_block_names_the_setting(utilization: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization") as err:
        MemoryPlan.of(USAGE, utilization, 0, bytes_per_block=MiB, wanted_blocks=10)
    assert "weights 16384 MiB" in str(err.value)


@pytest.mark.parametrize("utilization", [0.0, 1.5])
def test_utilization_out_of_range_is_refused(utilization: float) -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        MemoryPlan.of(USAGE, utilization, 0, bytes_per_block=MiB, wanted_blocks=10)


class FakeProbe:
    """A device of ``total`` bytes whose allocator reports ``weights`` allocated and a peak
    ``activations`` above it; records the profiling pass."""

    def __init__(self, total: int, weights: int, activations: int) -> None:
        self.total, self.weights, self.activations = total, weights, activations
        self.resets = 0

    def free_and_total(self) -> tuple[int, int]:
        return self.total - self.weights - 512 * MiB, self.total

    def reserved(self) -> int:
        return self.weights

    def allocated(self) -> int:
        return self.weights

    def reset_peak(self) -> None:
        self.resets += 1

    def peak_allocated(self) -> int:
        return self.weights + self.activations


@pytest.mark.parametrize("model", ["tiny-llava", "tiny-qwen2-vl"])
def test_the_profiling_pass_runs_the_lm_and_the_encoder_and_sizes_the_cache(model: str) -> None:
    llm = LLM(model, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4)
    engine = llm.engine
    calls: list[int] = []
    encode = engine.model.encode_images

    def counting(images: list[Any]) -> list[torch.Tensor]:
        calls.append(len(images))
        return encode(images)

    engine.model.encode_images = counting  # type: ignore[method-assign]
    probe = FakeProbe(total=4 * GiB, weights=GiB, activations=256 * MiB)
    capacity = 1000
    blocks = num_kv_blocks(
        engine.config, engine.model, engine.device, capacity, engine.encoder_budget,
        engine.processor, probe,
    )  # fmt: skip
    mc, cc = engine.config.model, engine.config.cache
    per_block = 2 * engine.model.num_layers * cc.block_size * engine.model.num_kv_heads
    per_block *= engine.model.head_dim * mc.dtype_bytes
    wanted = 4 * -(-256 // cc.block_size)
    assert probe.resets == 1 and calls and calls[0] >= 1
    assert blocks == wanted  # 4 GiB leaves far more than 4 sequences need
    encoder_bytes = capacity * mc.hidden_size * mc.dtype_bytes
    budget_left = int(4 * GiB * 0.9) - 512 * MiB - GiB - encoder_bytes  # before activations
    tight = FakeProbe(total=4 * GiB, weights=GiB, activations=budget_left - 20 * per_block + 7)
    tight_blocks = num_kv_blocks(
        engine.config, engine.model, engine.device, capacity, engine.encoder_budget,
        engine.processor, tight,
    )  # fmt: skip
    assert tight_blocks == 19  # 20 blocks minus 7 bytes: whole blocks only


def test_the_plan_keeps_room_for_the_decode_graphs() -> None:
    graphs = DeviceMemoryUsage(**{**USAGE.__dict__, "cuda_graphs": 2 * GiB})
    without = MemoryPlan.of(USAGE, 0.9, 1 * GiB, bytes_per_block=MiB, wanted_blocks=10**9)
    plan = MemoryPlan.of(graphs, 0.9, 1 * GiB, bytes_per_block=MiB, wanted_blocks=10**9)
    assert without.num_kv_blocks - plan.num_kv_blocks == 2 * GiB // MiB
    assert "CUDA graphs 2048 MiB" in plan.summary(block_size=16)
    with pytest.raises(ValueError, match="CUDA graphs 2048 MiB"):
        MemoryPlan.of(graphs, 0.3, 1 * GiB, bytes_per_block=MiB, wanted_blocks=10)


def test_the_profiling_pass_measures_the_largest_graph_bucket_and_the_pad_block() -> None:
    llm = LLM("tiny-qwen2-vl", max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4)
    engine = llm.engine
    graphs = DecodeGraphConfig((1, 2, 4), (256,), engine.config.cache.block_size, capture=False)
    runs: list[int] = []
    forward = DecodeGraphs._forward

    def counting(self: DecodeGraphs, count: int, context: int) -> None:
        runs.append(count * context)
        forward(self, count, context)

    probe = FakeProbe(total=4 * GiB, weights=GiB, activations=256 * MiB)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DecodeGraphs, "_forward", counting)
        usage = profile_memory(
            engine.model, probe, num_tokens=64, num_logit_rows=4, block_size=16,
            dtype=torch.float32, device=engine.device, dummy_image_data=[],
            decode_graphs=graphs,
        )  # fmt: skip
    pad_block = 2 * engine.model.num_layers * 16 * engine.model.num_kv_heads
    pad_block *= engine.model.head_dim * 4
    assert runs == [4 * 256] and probe.resets == 2  # one eager run of the largest bucket
    assert usage.cuda_graphs == 256 * MiB + pad_block  # the fake probe's peak, again
    assert usage.peak_activations == 256 * MiB
