"""float32 weights whose values are bfloat16 values, kept as packed bfloat16
(``use_bf16_weights``): the kernel gives ``F.linear``'s products on the widened weight at every
row count, a weight with any other value is left to oneDNN's packing, and an engine serving such
a checkpoint in float32 stays token-identical to transformers in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from mmserve import LLM, SamplingParams
from mmserve.kernels import cpu_ops, load_variant, unavailable_reason
from mmserve.layers.bf16_weights import pack_bf16_exact
from mmserve.layers.linear import Linear, use_bf16_weights, use_packed_float32
from mmserve.models.tiny import resolve_model_path
from tests.support.images import make_image
from tests.support.references import Reference


def built_variants() -> list[str]:
    found = []
    for variant in ("generic", "avx2", "avx512"):
        try:
            ops = load_variant(variant)
        except (ImportError, OSError):
            continue
        if variant == "generic" or torch.backends.cpu.get_cpu_capability().startswith(
            variant.upper()[:6]
        ):
            found.append(ops)
    return found


@pytest.fixture(scope="module")
def ops():
    assert cpu_ops() is not None, unavailable_reason()
    return cpu_ops()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 40, 129, 300])
@pytest.mark.parametrize(("out_features", "in_features"), [(64, 48), (37, 100), (13, 7), (40, 600)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_kernel_gives_f_linear_on_the_widened_weight(
    ops, rows, out_features, in_features, bias
):
    """Odd sizes take the remainder paths (a last tile padded with zero rows, an odd column
    count); 9+ rows take the any-row path, 129 and 300 its blocks of 128 rows; 600 inputs are
    three blocks of columns, each prefetching the next."""
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16().float()
    x = torch.randn(rows, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    packed = pack_bf16_exact(weight)
    assert packed is not None and packed.dtype == torch.bfloat16
    tile = ops.bf16_weight_tile_rows
    assert packed.shape == (-(-out_features // tile), in_features, tile)
    ours = ops.bf16_weight_linear(x, packed, b, out_features)
    assert ours.dtype == torch.float32 and ours.shape == (rows, out_features)
    atol = max(1e-5, 1e-7 * in_features)  # sums in another order than oneDNN's
    torch.testing.assert_close(ours, F.linear(x, weight, b), rtol=1e-5, atol=atol)


def test_every_built_variant_computes_the_same_products() -> None:
    """The generic (4-lane) build beside this CPU's (8 or 16 lanes): each packs and multiplies
    with its own tile, to the same result."""
    variants = built_variants()
    if len(variants) < 2:
        pytest.skip("one kernel variant built (MMSERVE_KERNEL_VARIANTS=all builds every one)")
    weight = torch.randn(70, 33).bfloat16().float()
    x = torch.randn(11, 33)
    for ops in variants:
        tile = ops.bf16_weight_tile_rows
        packed = torch.empty(-(-70 // tile), 33, tile, dtype=torch.bfloat16)
        assert ops.bf16_weight_pack(weight, packed) == 0
        for rows in (1, 6, 11):
            torch.testing.assert_close(
                ops.bf16_weight_linear(x[:rows], packed, None, 70), F.linear(x[:rows], weight)
            )


@pytest.mark.parametrize("shape", [(0, 48), (2, 0, 48)])
def test_no_rows_give_no_rows_as_f_linear_does(ops, shape) -> None:
    """A chunked prefill step in which no prompt ends asks the head for the logits of 0 rows."""
    from mmserve.layers.bf16_weights import bf16_linear

    weight = torch.randn(64, 48).bfloat16().float()
    packed = pack_bf16_exact(weight)
    assert packed is not None
    x = torch.randn(*shape)
    out = bf16_linear(x, packed, None, 64)
    assert out.shape == F.linear(x, weight).shape == (*shape[:-1], 64)


def test_a_weight_with_other_values_is_not_packed(ops) -> None:
    weight = torch.randn(20, 16).bfloat16().float()
    weight[3, 5] += 1e-6  # one value between two bfloat16 values
    assert pack_bf16_exact(weight) is None


def test_a_float32_weight_is_refused_from_its_first_row(ops, monkeypatch) -> None:
    """A float32 checkpoint's weights are refused without tiles or a pass over them all."""

    def pack(*_: object) -> int:
        raise AssertionError("packed a weight whose first row is not bfloat16 values")

    monkeypatch.setattr(ops, "bf16_weight_pack", pack)
    assert pack_bf16_exact(torch.randn(20, 16)) is None


def test_the_kernel_refuses_what_it_does_not_take(ops) -> None:
    packed = pack_bf16_exact(torch.zeros(16, 8))
    with pytest.raises(RuntimeError, match=r"float32 \[rows, in\]"):
        ops.bf16_weight_linear(torch.zeros(1, 8, dtype=torch.bfloat16), packed, None, 16)
    with pytest.raises(RuntimeError, match="packed for n rows"):
        ops.bf16_weight_linear(torch.zeros(1, 8), packed, None, 16 + 2 * packed.shape[2])
    with pytest.raises(RuntimeError, match="bias"):
        ops.bf16_weight_linear(torch.zeros(1, 8), packed, torch.zeros(3), 16)
    width = packed.shape[0] * packed.shape[2]
    with pytest.raises(RuntimeError, match=r"out must be a contiguous float32 CPU tensor \[8, "):
        ops.bf16_weight_unpack(packed, torch.zeros(8, width - 1))
    with pytest.raises(RuntimeError, match="out must be"):
        ops.bf16_weight_unpack(packed, torch.zeros(width, 8).t())  # not contiguous
    with pytest.raises(RuntimeError, match="packed must be"):
        ops.bf16_weight_unpack(packed.float(), torch.zeros(8, width))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.head = Linear(24, 50, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.proj = Linear(24, 40, bias=True)
        self.other = Linear(24, 8)  # float32 values that are not bfloat16 values


def test_the_layers_keep_bf16_bits_only_where_exact_and_oneDNN_packs_the_rest(ops) -> None:
    torch.manual_seed(0)
    model = Model()
    with torch.no_grad():
        for weight in (model.embed.weight, model.proj.weight):
            weight.copy_(weight.bfloat16().float())
    head, proj = model.embed.weight.detach().clone(), model.proj.weight.detach().clone()
    assert use_bf16_weights(model) == 2
    assert use_packed_float32(model) == 1  # only `other`
    assert model.other.packed is not None and model.other.bf16_packed is None
    assert model.proj.packed is None and model.proj.bf16_packed is not None
    assert model.proj.weight.shape == (40, 24) and model.proj.weight.untyped_storage().nbytes() == 4
    assert model.head.weight is model.embed.weight  # the lookups read the float32 copy
    with torch.inference_mode():
        for shape in ((1, 24), (9, 24), (2, 5, 24)):
            x = torch.randn(shape)
            torch.testing.assert_close(model.proj(x), F.linear(x, proj, model.proj.bias))
            torch.testing.assert_close(model.head(x), F.linear(x, head))


def test_the_env_var_turns_it_off(ops, monkeypatch) -> None:
    monkeypatch.setenv("MMSERVE_BF16_WEIGHTS", "0")
    model = Model()
    with torch.no_grad():
        model.proj.weight.copy_(model.proj.weight.bfloat16().float())
    assert use_bf16_weights(model) == 0


@pytest.fixture(scope="module")
def bf16_valued_llava(tmp_path_factory) -> Path:
    """tiny-llava with every weight rounded to a bfloat16 value, saved in float32 (what a
    bfloat16 checkpoint is once loaded in float32)."""
    source = resolve_model_path("tiny-llava")
    target = tmp_path_factory.mktemp("bf16-valued-llava")
    for item in source.iterdir():
        if item.suffix == ".safetensors":
            tensors = load_file(item)
            rounded = {
                k: v.bfloat16().float() if v.is_floating_point() else v for k, v in tensors.items()
            }
            save_file(rounded, target / item.name, metadata={"format": "pt"})
        elif item.is_file():
            (target / item.name).write_bytes(item.read_bytes())
    return target


def test_an_engine_in_float32_is_token_identical_to_transformers(ops, bf16_valued_llava) -> None:
    llm = LLM(str(bf16_valued_llava), dtype="float32", seed=0)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.bf16_packed is not None for m in linears)
    reference = Reference(str(bf16_valued_llava))
    images = [make_image(seed) for seed in (21, 22)]
    cases = [
        ("USER: <image>\nWhat is in the picture? ASSISTANT:", images[:1]),
        ("USER: <image>\n<image>\nCompare the two. ASSISTANT:", images),
        ("USER: Tell me a story about a cat. ASSISTANT:", []),
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt": p, "images": i} for p, i in cases], params, use_tqdm=False)
    for (prompt, imgs), out in zip(cases, outs, strict=True):
        assert list(out.outputs[0].token_ids) == reference.greedy(prompt, imgs, 12), prompt


def test_a_prompt_prefilled_in_chunks_is_token_identical_too(ops, bf16_valued_llava) -> None:
    """Steps that end no prompt run the packed head on 0 rows (the LLaVA-OneVision shape's
    1,458-token image failed this way with the default chunk budget)."""
    llm = LLM(str(bf16_valued_llava), dtype="float32", seed=0, max_num_batched_tokens=16)
    prompt = "USER: <image>\nWhat is in the picture? Describe it at length. ASSISTANT:"
    image = [make_image(23)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate({"prompt": prompt, "images": image}, params, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) > 2 * 16  # three or more chunks
    assert list(out.outputs[0].token_ids) == Reference(str(bf16_valued_llava)).greedy(
        prompt, image, 8
    )


@pytest.mark.parametrize("variant", ["this CPU's", "every built"])
def test_unpacking_gives_the_weight_back_transposed(ops, variant) -> None:
    """``bf16_weight_unpack`` widens the tiles into float32 [in, tiles x tile]: the weight
    transposed, the last tile's padding rows as zero columns."""
    for one in [ops] if variant == "this CPU's" else built_variants():
        tile = one.bf16_weight_tile_rows
        weight = torch.randn(70, 33).bfloat16().float()
        packed = torch.empty(-(-70 // tile), 33, tile, dtype=torch.bfloat16)
        assert one.bf16_weight_pack(weight, packed) == 0
        out = torch.full((33, packed.shape[0] * tile), float("nan"))
        one.bf16_weight_unpack(packed, out)
        assert torch.equal(out[:, :70], weight.t())
        assert not out[:, 70:].any()


@pytest.mark.parametrize("bias", [True, False])
def test_many_rows_go_to_onednn_on_the_weight_widened_for_the_call(ops, bias, monkeypatch) -> None:
    """From ``UNPACK_ROWS`` rows (a vision tower's patches, a long prefill chunk) oneDNN's
    float32 product outruns the kernel: the call widens the weight (transposed) and runs
    ``addmm`` on it; fewer rows, or a weight over ``UNPACK_BYTES`` in float32, stay on the
    kernel. Every path gives ``F.linear``'s products."""
    from mmserve.layers import bf16_weights
    from mmserve.layers.bf16_weights import UNPACK_ROWS, bf16_linear

    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(70, 96, generator=gen).bfloat16().float()
    b = torch.randn(70, generator=gen) if bias else None
    packed = pack_bf16_exact(weight)
    assert packed is not None
    calls: list[str] = []
    for name in ("bf16_weight_linear", "bf16_weight_unpack"):
        real = getattr(ops, name)
        monkeypatch.setattr(
            ops, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1]
        )
    x = torch.randn(2, UNPACK_ROWS // 2, 96, generator=gen)
    for rows, big_weight, path in [
        (UNPACK_ROWS // 2, False, "bf16_weight_unpack"),
        (UNPACK_ROWS // 2 - 1, False, "bf16_weight_linear"),
        (UNPACK_ROWS // 2, True, "bf16_weight_linear"),
    ]:
        calls.clear()
        limit = packed.numel() * 4 - 1 if big_weight else bf16_weights.UNPACK_BYTES
        monkeypatch.setattr(bf16_weights, "UNPACK_BYTES", limit)
        out = bf16_linear(x[:, :rows], packed, b, 70)
        assert calls == [path]
        torch.testing.assert_close(out, F.linear(x[:, :rows], weight, b), rtol=1e-5, atol=1e-5)
