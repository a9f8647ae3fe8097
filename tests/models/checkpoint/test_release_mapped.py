"""A weight mapped from its checkpoint and then replaced by a packed copy gives its pages back
(``release_mapped_pages``): without that, the packed copy and the touched file pages both
counted in the resident set, and a bfloat16 Qwen2-VL-2B shape took 8.6 GiB after load where
its weights are 4.4 GB. Only pages wholly inside the released tensor go; the rest of the file
stays mapped and readable."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from mmserve import LLM
from mmserve.layers.linear import Linear
from mmserve.models.checkpoint.safetensors_file import SafetensorsFile, release_mapped_pages

MIB = 1 << 20


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and first == "Rss:":
            total += int(line.split()[1]) * 1024
    return total


def test_released_pages_leave_the_resident_set_and_the_rest_stays(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    a, b = torch.randn(MIB // 2), torch.randn(MIB // 2)  # 2 MiB each, back to back
    save_file({"a": a, "b": b}, str(path))
    with SafetensorsFile(path) as f:
        view_a, view_b = f.mapped("a"), f.mapped("b")
    assert view_a is not None and view_b is not None
    assert float(view_a.sum()) == float(a.sum()) and float(view_b.sum()) == float(b.sum())
    before = mapped_rss(path)
    assert before >= 4 * MIB
    assert release_mapped_pages(view_a.view(1024, 512)[:, ::2]) == 0  # not one span
    assert mapped_rss(path) == before
    released = release_mapped_pages(view_a)
    assert 2 * MIB - 8192 <= released <= 2 * MIB  # the pages wholly inside a
    assert mapped_rss(path) <= before - released
    assert torch.equal(view_b, b)  # the neighbour is untouched
    assert torch.equal(view_a, a)  # and a page read again comes back from the file


def test_memory_that_is_not_a_mapping_is_left_alone() -> None:
    t = torch.randn(MIB)
    copy = t.clone()
    assert release_mapped_pages(t) == 0
    assert torch.equal(t, copy)


def test_an_engine_that_packs_its_linears_keeps_no_mapped_copy_of_them(tmp_path: Path) -> None:
    llm = LLM("tiny-llava-small", dtype="float32", seed=0)
    model = llm.engine.runner.model
    files = sorted(Path(llm.engine.config.model.path).glob("*.safetensors"))
    assert files
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed is not None or m.bf16_packed is not None for m in linears)
    dropped = [m for m in linears if m.weight.untyped_storage().nbytes() <= 4]  # not tied
    linear_bytes = sum(m.in_features * m.out_features * 4 for m in dropped)
    assert linear_bytes > 8 * MIB
    file_bytes = sum(f.stat().st_size for f in files)
    resident = sum(mapped_rss(f) for f in files)
    # what may stay resident: the checkpoint's other tensors (embeddings, norms, biases)
    assert resident <= file_bytes - linear_bytes + 64 * 1024 * len(linears)
