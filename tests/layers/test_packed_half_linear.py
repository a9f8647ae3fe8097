"""Half-precision Linear layers on a CPU that computes that dtype natively run oneDNN's prepacked
weights (``use_packed_half``; bfloat16 ones run the dot-product kernel instead where it applies,
test_bf16_dot_linear), at every row count: a decode step's few rows and a prefill's
many. Elsewhere (no native half arithmetic) they stay dense, for the small-batch kernel and
``F.linear``. The dense copy is dropped and the weight's shape, dtype and device stay
readable; a weight an embedding shares keeps its dense copy for the lookups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmserve import LLM, SamplingParams
from mmserve.layers.bf16_dot_weights import bf16_dot_kernel
from mmserve.layers.linear import (
    Linear,
    onednn_half_dtypes,
    use_packed_half,
    use_small_batch_kernel,
)

needs_onednn_bf16 = pytest.mark.skipif(
    torch.bfloat16 not in onednn_half_dtypes(),
    reason="this CPU has no native bfloat16 arithmetic (avx512_bf16 / amx_bf16) for oneDNN",
)


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24, dtype=torch.bfloat16)
        self.proj = Linear(24, 40, bias=True, dtype=torch.bfloat16)
        self.head = Linear(24, 50, bias=False, dtype=torch.bfloat16)
        self.head.weight = self.embed.weight
        self.fp16 = Linear(24, 8, dtype=torch.float16)
        self.full = Linear(24, 8)


def test_without_a_native_half_dtype_nothing_is_packed() -> None:
    model = Mixed()
    assert use_packed_half(model, frozenset()) == 0
    assert all(m.packed is None for m in model.modules() if isinstance(m, Linear))
    assert use_small_batch_kernel(model) in (0, 3)  # 0 without a kernel build


def test_only_the_cpus_native_dtypes_are_candidates() -> None:
    native = onednn_half_dtypes()
    assert native <= {torch.bfloat16, torch.float16}
    from mmserve.kernels.cpu_features import native_half_dtypes

    assert {getattr(torch, name) for name in native_half_dtypes()} >= native


@needs_onednn_bf16
def test_packed_bf16_products_match_f_linear_and_the_dense_copy_is_gone() -> None:
    torch.manual_seed(0)
    model = Mixed()
    weight, bias = model.proj.weight.detach().clone(), model.proj.bias.detach().clone()
    assert use_packed_half(model, frozenset({torch.bfloat16})) == 2  # proj and head
    assert model.proj.packed is not None and model.head.packed is not None
    assert model.fp16.packed is None and model.full.packed is None
    assert model.head.weight is model.embed.weight  # the lookups read it
    stand_in = model.proj.weight
    assert stand_in.shape == (40, 24) and stand_in.dtype == torch.bfloat16
    assert stand_in.untyped_storage().nbytes() == 2  # one element: the dense copy is freed
    assert use_small_batch_kernel(model) <= 1  # only the float16 layer, never a packed one
    assert model.proj.small_batch is None and model.head.small_batch is None
    with torch.inference_mode():
        for shape in ((1, 24), (3, 24), (8, 24), (9, 24), (300, 24), (2, 5, 24)):
            x = torch.randn(shape, dtype=torch.bfloat16)
            expected = F.linear(x.float(), weight.float(), bias.float())
            torch.testing.assert_close(model.proj(x).float(), expected, rtol=0.016, atol=0.016)
            torch.testing.assert_close(
                model.head(x).float(),
                F.linear(x.float(), model.embed.weight.float()),
                rtol=0.016,
                atol=0.016,
            )


@needs_onednn_bf16
@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-llava", "tiny-smolvlm"])
def test_an_engine_in_bfloat16_packs_every_linear_layer(model: str) -> None:
    llm = LLM(model, dtype="bfloat16", seed=0)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
    # bfloat16 goes to the dot-product kernel where it runs (bf16_dot_weights.py), else oneDNN
    dot = bf16_dot_kernel() is not None
    assert linears and all((m.dot_packed is not None) == dot for m in linears)
    assert all((m.packed is not None) != dot for m in linears)
    assert all(m.small_batch is None for m in linears)
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
