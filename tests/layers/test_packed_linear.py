"""float32 Linear layers on CPU run oneDNN's prepacked weights (``use_packed_float32``): the
same products as ``F.linear`` to float32 rounding, at every row count and input rank, with
the dense copy dropped and the weight's shape, dtype and device still readable; a weight an
embedding shares (a tied ``lm_head``) is packed too and keeps its dense copy for the embedding.
An engine in float32 packs every linear layer: the language model's, the vision tower's and
the projector's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmserve import LLM, SamplingParams
from mmserve.layers.linear import Linear, use_packed_float32


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.proj = Linear(24, 40, bias=True)
        self.head = Linear(24, 50, bias=False)
        self.head.weight = self.embed.weight
        self.bf16 = Linear(24, 8, dtype=torch.bfloat16)


def test_packed_products_equal_f_linear_and_the_dense_copy_is_gone() -> None:
    torch.manual_seed(0)
    model = Tied()
    weight, bias = model.proj.weight.detach().clone(), model.proj.bias.detach().clone()
    assert use_packed_float32(model) == 2  # the bfloat16 layer stays as it is
    assert model.proj.packed is not None and model.head.packed is not None
    assert model.bf16.packed is None and model.head.weight is model.embed.weight
    assert model.embed.weight.untyped_storage().nbytes() == 50 * 24 * 4  # lookups read it
    stand_in = model.proj.weight
    assert stand_in.shape == (40, 24) and stand_in.dtype == torch.float32
    assert stand_in.untyped_storage().nbytes() == 4  # one element: the 3.8 KB copy is freed
    with torch.inference_mode():
        for shape in ((1, 24), (7, 24), (300, 24), (2, 5, 24)):
            x = torch.randn(shape)
            torch.testing.assert_close(model.proj(x), F.linear(x, weight, bias))
            torch.testing.assert_close(model.head(x), F.linear(x, model.embed.weight))


@pytest.mark.parametrize(
    "model",
    [
        "tiny-llava",
        "tiny-qwen2-vl",
        "tiny-smolvlm",
        "tiny-qwen2.5-vl",
        "tiny-qwen3-vl",
        "tiny-gemma3",
    ],
)
def test_an_engine_in_float32_packs_every_linear_layer(model: str) -> None:
    llm = LLM(model, dtype="float32", seed=0)
    modules = list(llm.engine.runner.model.modules())
    dense = [type(m).__name__ for m in modules if type(m) is nn.Linear]
    assert not dense  # vision towers and projectors use mmserve's Linear too
    linears = [m for m in modules if isinstance(m, Linear)]
    assert linears and all(m.packed is not None for m in linears)
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
