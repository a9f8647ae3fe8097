"""Decode graph buckets and their settings: vLLM's names and capture sizes, the context
buckets of the fixed-shape attention, and when decode runs eagerly."""

from __future__ import annotations

import pytest

from mmserve.cli import build_parser
from mmserve.engine_args import EngineArgs
from mmserve.entrypoints.openai.cli_args import engine_args
from mmserve.graph_config import DecodeGraphConfig, batch_buckets, context_buckets


def test_default_batch_buckets_are_vllms_pattern_and_cover_max_num_seqs() -> None:
    assert batch_buckets(None, 64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert batch_buckets(None, 5) == (1, 2, 4, 8)  # a batch of 5 runs bucket 8
    assert batch_buckets(None, 3) == (1, 2, 4)
    assert batch_buckets(None, 1) == (1,)
    assert batch_buckets(None, 2048)[-1] == 512  # vLLM's cap: larger batches run eagerly


def test_given_sizes_follow_vllms_cuda_graph_sizes() -> None:
    assert batch_buckets([20], 64) == (1, 2, 4, 8, 16)  # one value: the pattern up to it
    assert batch_buckets([16, 1, 3, 3], 64) == (1, 3, 16)  # several: those
    assert batch_buckets([512], 12) == (1, 2, 4, 8, 16)  # past max_num_seqs: never used
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        batch_buckets([0, 4], 8)


def test_context_buckets_double_from_256_in_whole_blocks() -> None:
    assert context_buckets(8192, 16) == (256, 512, 1024, 2048, 4096, 8192)
    assert context_buckets(560, 16) == (256, 512, 560)
    assert context_buckets(100, 16) == (112,)
    assert context_buckets(1000, 48) == (288, 576, 1008)  # multiples of the block size
    with pytest.raises(ValueError, match="max_seq_len_to_capture"):
        context_buckets(0, 16)


def test_a_step_runs_the_smallest_bucket_that_holds_it() -> None:
    config = DecodeGraphConfig((1, 2, 4, 8), (256, 512), 16, capture=False)
    assert config.bucket(3, 17) == (4, 256)
    assert config.bucket(1, 256) == (1, 256)
    assert config.bucket(8, 257) == (8, 512)
    with pytest.raises(ValueError):
        config.bucket(9, 10)


@pytest.mark.parametrize(
    ("enforce_eager", "device", "expected"),
    [
        (None, "cuda", "capture"),
        (None, "cuda:1", "capture"),
        (False, "cuda", "capture"),
        (True, "cuda", None),
        (None, "cpu", None),  # not applicable on CPU
        (False, "cpu", "static"),  # asked for: the padded path without capture
        (True, "cpu", None),
    ],
)
def test_graphs_are_on_for_cuda_unless_enforce_eager(enforce_eager, device, expected) -> None:
    config = DecodeGraphConfig.resolve(
        enforce_eager, None, 8192, device, max_num_seqs=8, max_model_len=4096, block_size=16
    )
    if expected is None:
        assert config is None
        return
    assert config is not None and config.capture == (expected == "capture")
    assert config.batch_sizes == (1, 2, 4, 8) and config.max_context == 4096


def test_the_flags_are_vllms() -> None:
    parse = lambda *argv: engine_args(build_parser().parse_args(["serve", *argv]))  # noqa: E731
    assert parse().enforce_eager is None
    assert parse("--enforce-eager").enforce_eager is True
    assert parse("--no-enforce-eager").enforce_eager is False
    args = parse("--cuda-graph-sizes", "1", "2", "8", "--max-seq-len-to-capture", "4k")
    assert args.cuda_graph_sizes == [1, 2, 8] and args.max_seq_len_to_capture == 4000
    assert EngineArgs.from_kwargs(enforce_eager=True).enforce_eager is True
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineArgs(cuda_graph_sizes=[0])
    with pytest.raises(ValueError, match="max_seq_len_to_capture"):
        EngineArgs(max_seq_len_to_capture=0)
