"""``mmserve serve`` takes a ``vllm serve`` command line: positional model, vLLM's value syntax,
settings it cannot honour refused by name before anything loads, ``--version``, a torch-free
``--help``."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mmserve.arg_types import human_readable_int
from mmserve.cli import build_parser
from mmserve.config import resolve_dtype
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.openai.cli_args import engine_args
from mmserve.version import package_version


def serve_args(*argv: str) -> EngineArgs:
    return engine_args(build_parser().parse_args(["serve", *argv]))


def test_model_is_positional_or_a_flag() -> None:
    assert serve_args("tiny-qwen2-vl").model == "tiny-qwen2-vl"
    assert serve_args("--port", "9", "tiny-qwen2-vl").model == "tiny-qwen2-vl"
    assert serve_args("--model", "tiny-qwen2-vl").model == "tiny-qwen2-vl"
    assert serve_args("tiny-qwen2-vl", "--model", "tiny-qwen2-vl").model == "tiny-qwen2-vl"
    assert serve_args().model == EngineArgs().model


@pytest.mark.parametrize(
    "argv",
    [["tiny-qwen2-vl", "--model", "tiny-llava"], ["--model", "tiny-llava", "tiny-qwen2-vl"]],
)
def test_two_different_models_are_one_clear_error(
    argv: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "'tiny-qwen2-vl'" in err and "'tiny-llava'" in err and "--model" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("2048", 2048), ("2k", 2000), ("2K", 2048), ("32K", 32768), ("1m", 10**6),
     ("1M", 1 << 20), ("25.6k", 25600), ("1g", 10**9), (" 4K ", 4096)],
)  # fmt: skip
def test_human_readable_ints_follow_vllm(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_max_model_len_and_batch_take_vllm_ints() -> None:
    args = serve_args("--max-model-len", "2k", "--max-num-batched-tokens", "8K")
    assert (args.max_model_len, args.max_num_batched_tokens) == (2000, 8192)
    assert serve_args("--max-model-len", "auto").max_model_len is None
    assert serve_args("--max-model-len", "-1").max_model_len is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-model-len", "2.5K"],  # decimals need the decimal suffix, like vLLM
        ["--max-model-len", "two"],
        ["--dtype", "float64"],
        ["--limit-mm-per-prompt", '{"vision": 1}'],
        ["--gpu-memory-utilization", "most"],
    ],
)
def test_bad_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", *argv])
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "stored"),
    [("auto", "auto"), ("half", "float16"), ("float16", "float16"), ("bfloat16", "bfloat16"),
     ("float", "float32"), ("float32", "float32")],
)  # fmt: skip
def test_dtype_takes_vllm_names(value: str, stored: str) -> None:
    assert serve_args("--dtype", value).dtype == stored


def test_auto_dtype_is_float32_on_cpu_and_half_on_cuda() -> None:
    assert resolve_dtype("auto", "bfloat16", "cpu") == "float32"
    assert resolve_dtype("auto", "bfloat16", "cuda:0") == "bfloat16"
    assert resolve_dtype("auto", "float16", "cuda") == "float16"  # the checkpoint's half dtype
    assert resolve_dtype("auto", None, "cuda") == "bfloat16"
    assert resolve_dtype("auto", "float32", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "float64", "cuda") == "bfloat16"
    assert resolve_dtype("float16", "float32", "cpu") == "float16"  # asked for: kept


def test_vllm_settings_map_onto_engine_args() -> None:
    args = serve_args(
        "--kv-cache-memory-bytes", "2G", "-tp", "1", "--trust-remote-code", "--enforce-eager",
        "--gpu-memory-utilization", "0.9", "--limit-mm-per-prompt", '{"image": 2, "video": 0}',
        "--seed", "3", "--max-num-seqs", "5", "--no-enable-prefix-caching", "--device", "cpu",
    )  # fmt: skip
    assert args.kv_cache_memory == 2 << 30
    assert (args.seed, args.max_num_seqs, args.enable_prefix_caching) == (3, 5, False)
    assert args.scheduler_config().limit_mm_per_prompt == {"image": 2, "video": 0}
    assert args.scheduler_config().max_videos_per_prompt == 0
    notes = "\n".join(args.ignored_settings())
    for flag in ("--trust-remote-code", "--gpu-memory-utilization 0.9"):
        assert flag in notes
    assert args.enforce_eager is True and "--enforce-eager" not in notes  # honoured: no graphs
    assert serve_args().ignored_settings() == []
    long_form = serve_args("--limit-mm-per-prompt", '{"image": {"count": 3}}')
    assert long_form.limit_mm_per_prompt == {"image": 3}
    # the offline API takes vLLM's keyword too
    assert EngineArgs.from_kwargs(kv_cache_memory_bytes=1 << 20).kv_cache_memory == 1 << 20


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
        (["--limit-mm-per-prompt", '{"image": 1, "audio": 2}'], "audio=2"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    ],
)
def test_unsupported_settings_fail_before_torch_is_imported(argv: list[str], named: str) -> None:
    """``main`` returns 2 with one line naming the setting, and never imported torch (so no
    model was loaded)."""
    code = (
        "import sys; from mmserve.cli import main; "
        f"rc = main(['serve', *{argv!r}]); print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["2", "False"], out
    assert named in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--pipeline-parallel-size", "2"],
        ["-pp", "4"],
        ["--quantization", "awq"],
        ["--kv-cache-dtype", "fp8"],
        ["--enable-lora"],
        ["--tokenizer", "other/tokenizer"],
        ["--speculative-config", "{}"],
        ["--tool-call-parser", "mistral"],
    ],
)
def test_vllm_flags_mmserve_lacks_fail_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "tiny-llava", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mmserve serve: error: {' '.join(argv)} is not supported: "), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--pipeline-parallel-size", "1"],
        ["--quantization", "none"],
        ["--kv-cache-dtype", "auto"],
        ["--swap-space", "4"],
        ["--enable-chunked-prefill"],
        ["--disable-log-requests"],
        ["--disable-log-stats"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    ],
)
def test_vllm_flags_that_change_nothing_here_are_accepted(argv: list[str]) -> None:
    assert serve_args(*argv) == EngineArgs()


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mmserve.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"mmserve {package_version()}"
    assert package_version()[0].isdigit()


def test_help_imports_neither_torch_nor_transformers() -> None:
    """Building every help text stays on the torch-free path (what keeps ``--help`` fast)."""
    code = """
import sys
from mmserve.cli import build_parser
parser = build_parser()
parser.format_help()
for name, sub in parser._subparsers._group_actions[0].choices.items():
    sub.format_help()
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "fastapi"}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out


def test_serve_help_shows_the_vllm_syntax() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for snippet in ("MODEL", "--dtype", "half", "4k (4000)", "--kv-cache-memory-bytes", "-tp"):
        assert snippet in text, snippet
    assert "--quantization" not in text  # hidden; docs/vllm-compatibility.md lists them
    assert isinstance(build_parser().parse_args(["serve"]), argparse.Namespace)
