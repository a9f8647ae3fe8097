"""The safetensors loader reads tensors on several threads: every thread count gives the same
parameters (dtype-cast and stacked rows included), and a truncated shard is a ValueError naming
the file whichever thread reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mmserve.models.loader import load_safetensors


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
