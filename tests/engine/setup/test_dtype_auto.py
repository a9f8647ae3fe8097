"""``--dtype auto`` on CPU: the checkpoint's half dtype where the CPU runs it natively (flags
mocked, so both branches run on any machine), else float32; one start-up line says which."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import mmserve.engine.setup.dtype as dtype_module
from mmserve.config import resolve_dtype
from mmserve.engine.setup.dtype import choose_dtype
from mmserve.engine.setup.loading import create_engine_config
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.llm import LLM
from mmserve.kernels.cpu_features import native_half_dtypes, parse_cpu_flags
from mmserve.models.tiny import resolve_model_path
from mmserve.sampling_params import SamplingParams

EPYC_FLAGS = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
ZEN2_FLAGS = "flags\t\t: fpu sse2 avx2 fma f16c\n"
SAPPHIRE_RAPIDS = {"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}


def test_the_half_dtypes_a_cpu_runs_natively_come_from_its_flags() -> None:
    assert native_half_dtypes(parse_cpu_flags(EPYC_FLAGS)) == {"bfloat16": ("avx512_bf16",)}
    assert native_half_dtypes(parse_cpu_flags(ZEN2_FLAGS)) == {}
    assert native_half_dtypes(SAPPHIRE_RAPIDS) == {
        "bfloat16": ("avx512_bf16", "amx_bf16"),
        "float16": ("avx512_fp16",),
    }
    assert parse_cpu_flags("processor : 0\nFeatures : fp asimd bf16\n") == {"fp", "asimd", "bf16"}
    assert parse_cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    ("declared", "native", "expected"),
    [("bfloat16", ("bfloat16",), "bfloat16"), ("bfloat16", (), "float32"),
     ("float16", ("bfloat16",), "float32"), ("float16", ("float16",), "float16"),
     ("float32", ("bfloat16", "float16"), "float32"), (None, ("bfloat16",), "float32")],
)  # fmt: skip
def test_auto_on_cpu_is_the_checkpoints_half_dtype_only_where_native(
    declared: str | None, native: tuple[str, ...], expected: str
) -> None:
    assert resolve_dtype("auto", declared, "cpu", native) == expected
    assert resolve_dtype("bfloat16", "float32", "cpu", ()) == "bfloat16"  # asked for: kept
    assert resolve_dtype("auto", declared, "cuda:0", ()) == (
        declared if declared in ("float16", "bfloat16") else "bfloat16"
    )  # CUDA: today's rule, whatever the CPU


def test_the_reason_names_the_flags_or_the_missing_ones() -> None:
    native = choose_dtype("auto", "bfloat16", "cpu", {"bfloat16": ("avx512_bf16",)})
    assert native.log_line() == (
        "dtype: bfloat16 (auto on CPU: the checkpoint's bfloat16, native here (avx512_bf16))"
    )
    lacking = choose_dtype("auto", "bfloat16", "cpu", {})
    assert lacking.log_line() == (
        "dtype: float32 (auto on CPU: the checkpoint is bfloat16 but this CPU lacks"
        " avx512_bf16 or amx_bf16)"
    )
    assert choose_dtype("auto", "float32", "cpu", {}).reason == (
        "auto on CPU: the checkpoint declares float32"
    )
    assert (
        choose_dtype("float16", "float32", "cpu", {}).log_line()
        == "dtype: float16 (--dtype float16)"
    )
    assert choose_dtype("auto", "float32", "cuda:0", {}).dtype == "bfloat16"


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llava saved in bfloat16 (weights and config), as half-precision hub checkpoints are."""
    src = resolve_model_path("tiny-llava")
    dst = tmp_path_factory.mktemp("ckpt") / "tiny-llava-bf16"
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    config["dtype"] = "bfloat16"
    for sub in ("text_config", "vision_config"):
        if isinstance(config.get(sub), dict) and "dtype" in config[sub]:
            config[sub]["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def fake_cpu(monkeypatch: pytest.MonkeyPatch, flags: str) -> None:
    native = native_half_dtypes(parse_cpu_flags(flags))
    monkeypatch.setattr(dtype_module, "native_half_dtypes", lambda: native)


@pytest.mark.parametrize(
    ("flags", "expected", "line"),
    [(EPYC_FLAGS, "bfloat16", "dtype: bfloat16 (auto on CPU: the checkpoint's bfloat16, native"
      " here (avx512_bf16))"),
     (ZEN2_FLAGS, "float32", "dtype: float32 (auto on CPU: the checkpoint is bfloat16 but this"
      " CPU lacks avx512_bf16 or amx_bf16)")],
)  # fmt: skip
def test_a_bf16_checkpoint_resolves_by_the_cpus_flags_and_the_log_says_so(
    monkeypatch, caplog, bf16_checkpoint: Path, flags: str, expected: str, line: str
) -> None:
    fake_cpu(monkeypatch, flags)
    caplog.set_level(logging.INFO, logger=dtype_module.logger.name)
    config = create_engine_config(EngineArgs(model=str(bf16_checkpoint), device="cpu"))
    assert config.model.dtype == expected
    assert [r.getMessage() for r in caplog.records if r.name == dtype_module.logger.name] == [line]


def test_the_float32_presets_stay_float32_under_auto_on_a_bf16_cpu(monkeypatch) -> None:
    fake_cpu(monkeypatch, EPYC_FLAGS)
    for preset in ("tiny-llava", "tiny-qwen2-vl"):
        config = create_engine_config(EngineArgs(model=preset, device="cpu"))
        assert config.model.dtype == "float32", preset


def test_an_engine_on_a_bf16_cpu_serves_the_bf16_checkpoint_in_bf16(
    monkeypatch, bf16_checkpoint: Path
) -> None:
    fake_cpu(monkeypatch, EPYC_FLAGS)
    llm = LLM(str(bf16_checkpoint), device="cpu", max_num_seqs=2)
    assert {p.dtype for p in llm.engine.model.parameters()} == {torch.bfloat16}
    out = llm.generate(["USER: hello ASSISTANT:"], SamplingParams(max_tokens=4, logprobs=2))
    assert len(out[0].outputs[0].token_ids) == 4
