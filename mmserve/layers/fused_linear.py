"""Several checkpoint Linear layers that read the same input, stored and run as one (q/k/v,
gate/up): one GEMM per step instead of two or three."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mmserve.layers.linear import Linear


class StackedLinear(Linear):
    """One ``Linear`` whose output rows are checkpoint layers stacked in order.

    Invariants: shard ``i`` (checkpoint name ``<parent>.<shard_names[i]>``, e.g. ``q_proj``
    beside this module) owns rows ``offsets[i]:offsets[i + 1]`` of ``weight`` and ``bias``; the
    loader fills each shard from its own checkpoint tensor (``checkpoint_rows``), so HF names
    still load and a missing shard is a missing key.
    """

    def __init__(self, in_features: int, shards: Sequence[tuple[str, int]], bias: bool) -> None:
        super().__init__(in_features, sum(size for _, size in shards), bias=bias)
        self.shard_names = tuple(name for name, _ in shards)
        self.split_sizes = [size for _, size in shards]

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This layer's output cut into the shards' outputs (views)."""
        return out.split_with_sizes(self.split_sizes, dim=-1)

    def checkpoint_rows(self, module_name: str) -> dict[str, tuple[str, slice]]:
        """Checkpoint parameter name -> (this module's parameter name, the shard's rows)."""
        parent = module_name.rpartition(".")[0]
        prefix = f"{parent}." if parent else ""
        kinds = ("weight", "bias") if self.bias is not None else ("weight",)
        rows, start = {}, 0
        for name, size in zip(self.shard_names, self.split_sizes, strict=True):
            for kind in kinds:
                target = f"{module_name}.{kind}"
                rows[f"{prefix}{name}.{kind}"] = (target, slice(start, start + size))
            start += size
        return rows


def stacked_checkpoint_rows(model: nn.Module) -> dict[str, tuple[str, slice]]:
    """``checkpoint_rows`` of every ``StackedLinear`` in ``model``."""
    rows: dict[str, tuple[str, slice]] = {}
    for name, module in model.named_modules():
        if isinstance(module, StackedLinear):
            rows.update(module.checkpoint_rows(name))
    return rows
