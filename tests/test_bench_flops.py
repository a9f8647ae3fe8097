"""FLOP floor arithmetic: linear, causal attention and LM-head FLOPs of a request."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from mmserve.bench.flops import FlopModel, attention_flops, gemm_gflops


def test_request_flops_count_only_the_work_done():
    lm = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False))
    model = SimpleNamespace(language_model=lm, lm_head=nn.Linear(8, 100, bias=False))
    config = SimpleNamespace(
        num_attention_heads=2, hidden_size=8, num_hidden_layers=3, head_dim=None
    )
    flops = FlopModel(model, config, encoder_flops=1000.0)
    linear = 2 * (8 * 16 + 16 * 8)
    # 4 prompt tokens, none cached, 2 generated: positions 0..5 attend to 1..6 keys
    pairs = 1 + 2 + 3 + 4 + 5 + 6
    expected = 6 * linear + 4 * pairs * 2 * 4 * 3 + 2 * (2 * 800) + 1 * 1000
    assert flops.request(4, 0, 2, 1) == expected
    # a prefix hit on the first 3 tokens skips their linear and attention work
    assert attention_flops(config, 3, 6) == 4 * (4 + 5 + 6) * 2 * 4 * 3
    assert flops.request(4, 3, 2, 0) == 3 * linear + attention_flops(config, 3, 6) + 2 * 1600


def test_gemm_rate_is_measured_and_threads_restored():
    before = torch.get_num_threads()
    assert gemm_gflops(1, size=128, repeats=3) > 0
    assert torch.get_num_threads() == before
