"""bfloat16 linears on AVX-512 BF16 dot products (``bf16_dot_weights.py``,
``bf16_dot_linear.cpp``): the packing, the kernel against float32 products at every row count
the kernel splits differently (decode rows 1-8, prefill rows in groups and column blocks, the
last panel narrower, a last block of fewer than 16 rows), and the layers that use it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmserve import LLM, SamplingParams
from mmserve.kernels import bf16_dot_linear_kernel
from mmserve.layers import bf16_dot_weights
from mmserve.layers.bf16_dot_weights import bf16_dot_kernel, pack_bf16_pairs
from mmserve.layers.linear import Linear, is_packed, use_bf16_dot_weights, use_packed_half
from tests.layers import test_packed_half_linear

needs_kernel = pytest.mark.skipif(
    bf16_dot_linear_kernel() is None,
    reason="needs the AVX-512 kernels on a CPU with AVX-512 BF16",
)


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.float(), w.float(), None if bias is None else bias.float())


def assert_rounded_once(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Float32 sums rounded once to bfloat16: within one bfloat16 step of the float32 product
    (2^-8 relative), plus float32 summation-order noise."""
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    atol = 1e-4 * expected.abs().max().item() if expected.numel() else 0.0
    torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=atol)


def test_the_packing_puts_two_columns_of_sixteen_rows_side_by_side() -> None:
    w = torch.arange(20 * 6, dtype=torch.float32).reshape(20, 6).bfloat16()
    packed = pack_bf16_pairs(w)
    assert packed.shape == (2, 3, 32)  # 20 rows -> 2 blocks of 16; 6 columns -> 3 pairs
    assert packed[0, 1, 2 * 5].item() == w[5, 2].item()  # block 0, pair 1, row 5, first value
    assert packed[0, 1, 2 * 5 + 1].item() == w[5, 3].item()
    assert packed[1, 2, 2 * 3 + 1].item() == w[19, 5].item()  # block 1 holds rows 16-19
    assert not packed[1, :, 8:].any()  # rows 20-31 are padding
    assert packed.data_ptr() != w.data_ptr()


@pytest.mark.parametrize("shape", [(4, 5), (4, 3)])
def test_the_packing_refuses_odd_columns_and_other_dtypes(shape: tuple[int, int]) -> None:
    weight = torch.zeros(shape, dtype=torch.bfloat16 if shape[1] % 2 else torch.float32)
    with pytest.raises(ValueError, match="even in"):
        pack_bf16_pairs(weight)


def test_the_packing_of_two_columns_is_a_copy() -> None:
    w = torch.randn(16, 2).bfloat16()  # permuting it is a view of the same bytes
    packed = pack_bf16_pairs(w)
    assert packed.data_ptr() != w.data_ptr()
    w.zero_()
    assert packed.any()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 130, 300])
@pytest.mark.parametrize("n,k", [(40, 24), (112, 64), (200, 2100), (17, 2), (304, 1030)])
def test_the_kernel_matches_float32_products_rounded_once(rows: int, n: int, k: int) -> None:
    torch.manual_seed(rows * 1000 + n)
    w, bias, x = torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16(), torch.randn(rows, k)
    x = x.bfloat16()
    kernel = bf16_dot_linear_kernel()
    assert kernel is not None
    packed = pack_bf16_pairs(w)
    assert_rounded_once(kernel(x, packed, None, n), reference(x, w, None))
    assert_rounded_once(kernel(x, packed, bias, n), reference(x, w, bias))


@needs_kernel
def test_the_kernel_reads_strided_rows_and_takes_no_rows() -> None:
    kernel = bf16_dot_linear_kernel()
    assert kernel is not None
    w = torch.randn(112, 64).bfloat16()
    packed = pack_bf16_pairs(w)
    wide = torch.randn(12, 100).bfloat16()
    for x in (wide[:, 10:74], wide[:5, 10:74], wide[:1, 10:74], wide[:, 10:74].t().t()):
        assert torch.equal(kernel(x, packed, None, 112), kernel(x.contiguous(), packed, None, 112))
    columns = torch.randn(64, 9).bfloat16()[:, 0:1].t()  # one row whose values are strided
    assert torch.equal(
        kernel(columns, packed, None, 112), kernel(columns.contiguous(), packed, None, 112)
    )
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16), packed, None, 112).shape == (0, 112)


@needs_kernel
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda k, p: k(torch.zeros(2, 64), p, None, 112), "x must be a bfloat16"),
        (lambda k, p: k(torch.zeros(2, 62, dtype=torch.bfloat16), p, None, 112), r"\[rows, 64\]"),
        (lambda k, p: k(torch.zeros(2, 64, dtype=torch.bfloat16), p, None, 96), "not 96"),
        (lambda k, p: k(torch.zeros(2, 64, dtype=torch.bfloat16), p.float(), None, 112), "packed"),
        (
            lambda k, p: k(torch.zeros(2, 64, dtype=torch.bfloat16), p, torch.zeros(111), 112),
            "bias must be",
        ),
    ],
)
def test_the_kernel_refuses_what_it_cannot_read(call: object, match: str) -> None:
    kernel = bf16_dot_linear_kernel()
    packed = pack_bf16_pairs(torch.zeros(112, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=match):
        call(kernel, packed)  # type: ignore[operator]


class Mixed(test_packed_half_linear.Mixed):
    def __init__(self) -> None:
        super().__init__()
        self.odd = Linear(23, 8, dtype=torch.bfloat16)  # an odd number of inputs: not packed


@needs_kernel
def test_layers_in_bfloat16_run_the_kernel_and_drop_their_dense_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bf16_dot_weights, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    torch.manual_seed(0)
    model = Mixed()
    weight, bias = model.proj.weight.detach().clone(), model.proj.bias.detach().clone()
    released: list[torch.Tensor] = []
    assert use_bf16_dot_weights(model, released.append) == 2  # proj and head
    assert [m.dot_packed is not None for m in (model.odd, model.fp16, model.full)] == [0, 0, 0]
    assert len(released) == 1 and released[0].shape == (40, 24)  # the head's is the embedding's
    assert model.head.weight is model.embed.weight
    stand_in = model.proj.weight
    assert stand_in.shape == (40, 24) and stand_in.dtype == torch.bfloat16
    assert stand_in.untyped_storage().nbytes() == 2  # one element: the dense copy is freed
    assert use_packed_half(model, frozenset({torch.bfloat16})) == 1  # only the odd one is left
    assert all(is_packed(m) for m in (model.proj, model.head, model.odd))
    with torch.inference_mode():
        for shape in ((1, 24), (3, 24), (8, 24), (9, 24), (300, 24), (2, 5, 24), (0, 24)):
            x = torch.randn(shape, dtype=torch.bfloat16)
            out = model.proj(x)
            assert out.shape == (*shape[:-1], 40)
            assert_rounded_once(out, reference(x, weight, bias))
            assert_rounded_once(model.head(x), reference(x, model.embed.weight, None))


@needs_kernel
def test_amx_cpus_and_the_switch_keep_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bf16_dot_weights, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert bf16_dot_kernel() is not None
    monkeypatch.setenv("MMSERVE_BF16_DOT_WEIGHTS", "0")
    assert bf16_dot_kernel() is None and use_bf16_dot_weights(Mixed()) == 0
    monkeypatch.delenv("MMSERVE_BF16_DOT_WEIGHTS")
    monkeypatch.setattr(bf16_dot_weights, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert bf16_dot_kernel() is None and use_bf16_dot_weights(Mixed()) == 0


@pytest.mark.skipif(bf16_dot_kernel() is None, reason="the kernel does not run on this CPU")
def test_an_engine_in_bfloat16_runs_its_linears_on_the_kernel() -> None:
    llm = LLM("tiny-qwen2-vl", dtype="bfloat16", seed=0)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.dot_packed is not None for m in linears)
    params = SamplingParams(temperature=0, max_tokens=4)
    out = llm.generate(["Hello", "A longer prompt of more words"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [4, 4]
