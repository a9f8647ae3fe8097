"""The small-batch half-precision linear kernel and the Linear layer that routes to it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmserve.kernels import small_batch_linear_kernel, unavailable_reason
from mmserve.layers.fused_linear import StackedLinear
from mmserve.layers.linear import Linear, use_small_batch_kernel

HALF = [torch.bfloat16, torch.float16]


def kernel_and_rows():
    found = small_batch_linear_kernel()
    assert found is not None, unavailable_reason()
    return found


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(("out_features", "in_features"), [(64, 48), (37, 100), (13, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_a_float32_reference_as_closely_as_torch(
    dtype, rows, out_features, in_features, bias
):
    """Odd sizes take the remainder paths (weights rows not a multiple of the rows done at
    once, inputs not a multiple of the vector width)."""
    kernel, _ = kernel_and_rows()
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    w = torch.randn(out_features, in_features, generator=gen).to(dtype)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    exact = x.float() @ w.float().T + (b.float() if b is not None else 0)
    ours = kernel(x, w, b)
    assert ours.dtype == dtype and ours.shape == (rows, out_features)
    # float32 accumulation, rounded once: within one rounding of the dtype of the exact value
    rounding = torch.finfo(dtype).eps * exact.abs().clamp(min=1.0)
    assert ((ours.float() - exact).abs() <= rounding).all()
    torch_error = (F.linear(x, w, b).float() - exact).abs().max()
    assert (ours.float() - exact).abs().max() <= torch_error + rounding.max()


def test_refuses_what_it_does_not_take():
    kernel, rows = kernel_and_rows()
    w = torch.zeros(4, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        kernel(torch.zeros(1, 16), w.float(), None)
    with pytest.raises(RuntimeError, match=f"1 to {rows} rows"):
        kernel(torch.zeros(rows + 1, 16, dtype=torch.bfloat16), w, None)
    with pytest.raises(RuntimeError, match=r"\[rows, in\]"):
        kernel(torch.zeros(1, 8, dtype=torch.bfloat16), w, None)
    with pytest.raises(RuntimeError, match="bias"):
        kernel(torch.zeros(1, 16, dtype=torch.bfloat16), w, torch.zeros(3, dtype=torch.bfloat16))


class Counting:
    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args):
        self.calls += 1
        return self.kernel(*args)


def test_linear_routes_decode_rows_to_the_kernel_only_in_half_precision():
    kernel, rows = kernel_and_rows()
    model = torch.nn.Sequential(
        Linear(32, 16), StackedLinear(16, [("a", 8), ("b", 8)], bias=False), torch.nn.Linear(16, 4)
    )
    assert use_small_batch_kernel(model) == 0  # float32: transformers' op, token-identical
    model = model.to(torch.bfloat16)
    assert use_small_batch_kernel(model) == 2  # the two mmserve Linears, not nn.Linear
    spy = Counting(kernel)
    model[0].small_batch = spy
    x = torch.randn(rows + 1, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        few, many = model[0](x[:rows]), model[0](x)
    assert spy.calls == 1  # rows + 1 rows run torch's GEMM
    torch.testing.assert_close(few, F.linear(x[:rows], model[0].weight, model[0].bias))
    torch.testing.assert_close(many, F.linear(x, model[0].weight, model[0].bias))
    model[0](x[:1]).sum().backward()  # autograd on: torch's op, which has a backward
    assert spy.calls == 1 and model[0].weight.grad is not None
