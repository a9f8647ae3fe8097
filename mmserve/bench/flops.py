"""The FLOP floor of a run: the model's arithmetic for the work actually done, divided by this
machine's measured float32 GEMM rate — the wall time no engine can beat on these cores.

Counted: every linear layer of the language model (2 FLOP per weight per token), causal
attention (4 FLOP per head dimension per query-key pair), the LM head for sampled tokens, and
the vision encoder as ``torch.utils.flop_counter`` counts one ``encode_images`` call. Tokens a
prefix-cache hit skipped and images an encoder-cache hit skipped are not counted: the floor is
for the work the engine did, so caching shows up in the wall time, not in the ratio.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode


def gemm_gflops(threads: int, size: int = 1536, repeats: int = 9) -> float:
    """Median float32 ``torch.mm`` rate (GFLOP/s) on ``threads`` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            rates.append(2 * size**3 / (time.perf_counter() - start) / 1e9)
        return statistics.median(rates)
    finally:
        torch.set_num_threads(previous)


def decoder_linear_flops_per_token(language_model: torch.nn.Module) -> float:
    return 2.0 * sum(
        m.weight.numel() for m in language_model.modules() if isinstance(m, torch.nn.Linear)
    )


def attention_flops(text_config: Any, start: int, end: int) -> float:
    """Queries at positions [start, end), each attending to every key up to its own."""
    heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    pairs = (end * (end + 1) - start * (start + 1)) / 2
    return 4.0 * pairs * heads * head_dim * text_config.num_hidden_layers


def encoder_flops_per_image(model: Any, pixel_values: Any) -> float:
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model.encode_images([pixel_values])
    return float(counter.get_total_flops())


class FlopModel:
    """FLOPs of one request on one engine's model: prompt tokens computed (after prefix hits),
    tokens generated, images encoded."""

    def __init__(self, model: Any, text_config: Any, encoder_flops: float) -> None:
        self.text_config = text_config
        self.linear = decoder_linear_flops_per_token(model.language_model)
        self.lm_head = 2.0 * model.lm_head.weight.numel()
        self.encoder = encoder_flops

    def request(self, prompt: int, cached: int, generated: int, images_encoded: int) -> float:
        end = prompt + generated
        tokens = end - cached
        return (
            tokens * self.linear
            + attention_flops(self.text_config, cached, end)
            + generated * self.lm_head
            + images_encoded * self.encoder
        )
