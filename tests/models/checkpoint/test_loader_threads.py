"""The safetensors loader reads tensors on several threads: every thread count gives the same
parameters (dtype-cast and stacked rows included), and a truncated shard is a ValueError naming
the file whichever thread reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mmserve.models.checkpoint.loader import load_safetensors


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 96)
        self.b = nn.Linear(96, 32, bias=False)


def _checkpoint(tmp_path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(96, 64, generator=gen).to(dtype),
        "a.bias": torch.randn(96, generator=gen).to(dtype),
        "b.weight": torch.randn(32, 96, generator=gen).to(dtype),
    }
    save_file({"a.weight": tensors["a.weight"]}, str(tmp_path / "model-1.safetensors"))
    save_file(
        {k: tensors[k] for k in ("a.bias", "b.weight")}, str(tmp_path / "model-2.safetensors")
    )
    return tensors


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_every_thread_count_loads_the_same_weights(
    tmp_path: Path, stored: torch.dtype, threads: int
) -> None:
    tensors = _checkpoint(tmp_path, stored)
    model = TwoLayers().to(torch.bfloat16)  # float16 files are cast on load
    load_safetensors(model, tmp_path, [], read_threads=threads)
    for name, param in model.state_dict().items():
        assert torch.equal(param, tensors[name].to(torch.bfloat16)), name


def test_a_truncated_shard_is_a_value_error_naming_it(tmp_path: Path) -> None:
    _checkpoint(tmp_path, torch.bfloat16)
    shard = tmp_path / "model-2.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model-2\.safetensors is truncated"):
        load_safetensors(TwoLayers().to(torch.bfloat16), tmp_path, [], read_threads=2)


def test_a_cpu_weight_in_the_checkpoint_dtype_is_a_view_of_the_file(tmp_path: Path) -> None:
    """Mapped copy-on-write: no copy, shared by tied holders, and writes never reach the file."""
    tensors = _checkpoint(tmp_path, torch.bfloat16)
    model = TwoLayers().to(torch.bfloat16)
    model.tied = nn.Linear(64, 96, bias=False)  # holds the same parameter as `a`
    model.tied.weight = model.a.weight
    before = (tmp_path / "model-1.safetensors").read_bytes()
    load_safetensors(model, tmp_path, [], tied={"tied.weight": "a.weight"}, read_threads=2)
    weight = model.a.weight
    assert model.tied.weight is weight and torch.equal(weight, tensors["a.weight"])
    storage = weight.untyped_storage()
    assert not storage.resizable()  # a torch.frombuffer view, not an allocation of its own
    with torch.no_grad():
        weight.zero_()
    assert (tmp_path / "model-1.safetensors").read_bytes() == before
    fp16 = TwoLayers().to(torch.float16)  # another dtype: read and cast into its own memory
    load_safetensors(fp16, tmp_path, [], read_threads=2)
    assert fp16.a.weight.untyped_storage().resizable()


def test_a_header_whose_offsets_do_not_span_the_shape_is_a_value_error(tmp_path: Path) -> None:
    """Mapped or read, a tensor whose header claims more elements than its bytes hold is refused
    naming the file and tensor (not a reshape error from deep inside torch)."""
    import json
    import struct

    _checkpoint(tmp_path, torch.bfloat16)
    shard = tmp_path / "model-2.safetensors"
    raw = shard.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header["b.weight"]["shape"] = [32, 97]  # the bytes hold 32 x 96
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    assert len(text) == size
    shard.write_bytes(raw[:8] + text + raw[8 + size :])
    for dtype in (torch.bfloat16, torch.float16):  # mapped, then read and cast
        model = TwoLayers().to(dtype)
        model.b = nn.Linear(97, 32, bias=False).to(dtype)
        with pytest.raises(ValueError, match=r"model-2\.safetensors: tensor 'b\.weight' has"):
            load_safetensors(model, tmp_path, [], read_threads=2)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from mmserve.layers.fused_linear import StackedLinear

        self.qkv_proj = StackedLinear(16, [("q_proj", 16), ("k_proj", 8), ("v_proj", 8)], True)
        self.o_proj = nn.Linear(16, 16, bias=False)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from mmserve.layers.fused_linear import StackedLinear

        self.gate_up_proj = StackedLinear(16, [("gate_proj", 24), ("up_proj", 24)], bias=False)
        self.down_proj = nn.Linear(24, 16, bias=False)


class StackedBlock(nn.Module):
    """A gate/up pair and a q/k/v triple stacked as the model families stack them."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(), MLP()


def test_a_stacked_weight_whose_parts_lie_back_to_back_is_a_view_of_the_file(
    tmp_path: Path,
) -> None:
    """``save_file`` orders tensors by name, as the hub's files are: gate_proj then up_proj lie
    back to back, so the stacked gate/up weight maps as one view; q/k/v do not (k_proj, o_proj,
    q_proj, v_proj), so their rows are read. Both hold the checkpoint's values."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"mlp.gate_proj.weight": (24, 16), "mlp.up_proj.weight": (24, 16)}
    shapes |= {"mlp.down_proj.weight": (16, 24), "self_attn.o_proj.weight": (16, 16)}
    for name, rows in (("q_proj", 16), ("k_proj", 8), ("v_proj", 8)):
        shapes |= {f"self_attn.{name}.weight": (rows, 16), f"self_attn.{name}.bias": (rows,)}
    tensors = {k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = StackedBlock().to(torch.bfloat16)
    load_safetensors(model, tmp_path, [], read_threads=2)
    gate_up = model.mlp.gate_up_proj.weight
    mlp = [tensors["mlp.gate_proj.weight"], tensors["mlp.up_proj.weight"]]
    assert torch.equal(gate_up, torch.cat(mlp))
    assert _mapped_from(gate_up) == tmp_path / "model.safetensors"
    qkv = torch.cat([tensors[f"self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(model.self_attn.qkv_proj.weight, qkv)
    assert _mapped_from(model.self_attn.qkv_proj.weight) is None  # read into its own memory
    bias = torch.cat([tensors[f"self_attn.{n}_proj.bias"] for n in "qkv"])
    assert torch.equal(model.self_attn.qkv_proj.bias, bias)
    _swap_names(tmp_path / "model.safetensors")  # up_proj's bytes now come first
    model = StackedBlock().to(torch.bfloat16)
    load_safetensors(model, tmp_path, [], read_threads=2)
    assert torch.equal(model.mlp.gate_up_proj.weight, torch.cat(mlp[::-1]))
    assert _mapped_from(model.mlp.gate_up_proj.weight) is None


def _mapped_from(tensor: torch.Tensor) -> Path | None:
    """The file whose mapping holds ``tensor``'s data (``/proc/self/maps``), or None."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            return Path(fields[5]) if len(fields) == 6 and fields[5].startswith("/") else None
    return None


def _swap_names(path: Path) -> None:
    """Swap the header entries of mlp.gate_proj and mlp.up_proj in ``path``: up_proj's bytes
    come first, each name holding the other's values."""
    import json
    import struct

    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    gate, up = "mlp.gate_proj.weight", "mlp.up_proj.weight"
    header[gate], header[up] = header[up], header[gate]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    path.write_bytes(raw[:8] + text + raw[8 + size :])
