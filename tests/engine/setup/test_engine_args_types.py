"""``LLM(...)`` / ``EngineArgs(...)`` given a setting of the wrong type: the command line's
syntax where the flag has one (``kv_cache_memory="1GiB"`` as ``--kv-cache-memory 1GiB``), else
a ``ValueError`` naming the setting and the value, before anything loads -- never a
``TypeError`` from deep in the engine, and never a wrong value taken as it came
(``enable_prefix_caching="no"`` is truthy)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.llm import LLM

GiB = 1 << 30


def test_a_setting_given_in_the_command_lines_syntax_reads_as_its_flag_does() -> None:
    args = EngineArgs(
        kv_cache_memory="1GiB",
        encoder_cache_memory="512MiB",
        max_model_len="4k",
        limit_mm_per_prompt='{"image": 3}',
        processor_kwargs='{"size": {"longest_edge": 512}}',
    )
    assert args.kv_cache_memory == GiB
    assert args.encoder_cache_memory == GiB // 2
    assert args.max_model_len == 4000
    assert args.limit_mm_per_prompt == {"image": 3}
    assert args.processor_kwargs == {"size": {"longest_edge": 512}}
    assert (
        args.cache_config()
        == EngineArgs(kv_cache_memory=GiB, encoder_cache_memory=GiB // 2).cache_config()
    )


def test_vllm_style_values_are_taken_as_vllm_takes_them(tmp_path: Path) -> None:
    assert EngineArgs(dtype=torch.bfloat16).dtype == "bfloat16"  # vLLM's LLM(dtype=torch.*)
    assert EngineArgs(dtype=torch.float32).dtype == "float32"
    assert EngineArgs(encoder_store_dir=tmp_path).encoder_store_dir == str(tmp_path)
    assert EngineArgs(cuda_graph_sizes=(1, 2, 4)).cuda_graph_sizes == [1, 2, 4]
    assert EngineArgs(gpu_memory_utilization=1).gpu_memory_utilization == 1


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_num_seqs", "eight"),
        ("max_num_seqs", 8.5),
        ("block_size", True),
        ("kv_cache_memory", "lots"),
        ("kv_cache_memory", 2.5),
        ("encoder_cache_memory", [1]),
        ("enable_prefix_caching", "no"),
        ("enable_encoder_cache", 0),
        ("gpu_memory_utilization", "most"),
        ("limit_mm_per_prompt", "image"),
        ("limit_mm_per_prompt", {"image": "2"}),
        ("cuda_graph_sizes", 4),
        ("cuda_graph_sizes", [1, "2"]),
        ("seed", None),
        ("processor_kwargs", ["size"]),
        ("dtype", 16),
        ("encoder_store_ttl", "1h"),
    ],
)
def test_a_value_of_the_wrong_type_is_a_value_error_naming_it(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=setting) as err:
        EngineArgs(**{setting: value})
    assert repr(value) in str(err.value) or str(value) in str(err.value)


def test_the_kv_cache_memory_must_be_positive() -> None:
    for value in (0, -5, "0MiB"):
        with pytest.raises(ValueError, match="kv_cache_memory must be >= 1"):
            EngineArgs(kv_cache_memory=value)


def test_llm_refuses_a_mistyped_setting_before_it_loads_anything() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM("tiny-llava", max_num_seqs="many")
