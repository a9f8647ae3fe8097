"""Paged KV cache tensors and causal attention over block tables (CPU kernel or pure torch)."""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field
from typing import Literal

import torch

from mmserve.config import ATTENTION_BACKENDS
from mmserve.kernels import (
    kernel_dtypes,
    kernel_head_dims,
    paged_attention_kernel,
    unavailable_reason,
)
from mmserve.layers.attention_flex import FlexAttentionPlan, flex_paged_attention
from mmserve.layers.attention_masks import ImageRanges
from mmserve.layers.attention_static import StaticDecodePlan, static_decode_attention
from mmserve.layers.attention_torch import (
    TorchAttentionPlan,
    torch_paged_attention,
)

logger = logging.getLogger(__name__)


@dataclass
class AttentionMetadata:
    """One step's batch as attention sees it.

    Sequence b owns query rows ``[query_start_loc[b], query_start_loc[b + 1])`` of the flat
    batch; they are its last positions, so with ``L = seq_lens[b]`` keys its row i sits at
    position ``L - q_len + i`` and attends keys ``0 .. L - q_len + i``. Keys live in the cache
    at ``block_tables[b][pos // block_size] * block_size + pos % block_size``.
    ``image_ranges`` (models with bidirectional image attention only): per sequence, the
    absolute ``[start, end)`` of each image overlapping its query rows; its queries also see
    the later keys of their own image (the scheduler never splits an image across steps).
    ``static_decode`` (decode steps at a fixed shape, ``worker.cuda_graphs``): every sequence
    has one query, and attention reads the plan's fixed key positions instead.
    ``use_kernel``: every row of the step goes to the CPU kernel in one call, prefill chunks and
    decodes alike: it reads the keys in place, where the torch path gathers a copy of each
    sequence's keys first (measured in docs/devices.md, "Attention backends").
    """

    slot_mapping: torch.Tensor  # [T] long: cache slot of each scheduled token
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32, rows padded with block 0
    block_size: int
    query_lens_host: list[int]
    seq_lens_host: list[int]
    use_kernel: bool
    image_ranges: list[ImageRanges] | None = None
    use_flex: bool = False
    static_decode: StaticDecodePlan | None = None
    _torch_plan: TorchAttentionPlan | None = field(default=None, repr=False)
    _flex_plan: FlexAttentionPlan | None = field(default=None, repr=False)

    def torch_plan(self) -> TorchAttentionPlan:
        """The pure-torch backend's per-step plan, built once and shared by every layer."""
        if self._torch_plan is None:
            self._torch_plan = TorchAttentionPlan.build(
                self.block_tables.long(),
                self.query_lens_host,
                self.seq_lens_host,
                self.block_size,
                self.image_ranges,
            )
        return self._torch_plan

    def flex_plan(self, num_slots: int) -> FlexAttentionPlan:
        """The flex backend's block mask for this step, built once and shared by every layer."""
        if self._flex_plan is None:
            self._flex_plan = FlexAttentionPlan.build(
                self.block_tables,
                self.query_start_loc,
                self.seq_lens,
                self.query_lens_host,
                self.block_size,
                num_slots,
            )
        return self._flex_plan


class PagedKVCache:
    """K and V for every layer as [num_blocks * block_size, num_kv_heads, head_dim] tensors.

    Zero-initialised so padded reads never see NaNs. Slot s belongs to block s // block_size.
    On the CPU the zeros are the kernel's (``zeroed``): allocation touches no page, a page
    costs its fault when a request first writes it, and an idle cache holds no memory.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.keys = [zeroed(shape, dtype, device) for _ in range(num_layers)]
        self.values = [zeroed(shape, dtype, device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype_bytes: int
    ) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros``, but on the CPU backed by a private anonymous mapping: the kernel's
    zero pages, filled on first touch, instead of memset over every byte up front (1 GiB of KV
    cache took ~2.4 s of CPU at start-up, and that much resident memory before any request)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = 1
    for dim in shape:
        count *= dim
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)


def select_attention_backend(
    requested: str,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    attention_masks: str | None = None,
) -> Literal["cpu-kernel", "torch", "flex"]:
    """``auto`` takes the CPU kernel where it applies (CPU, a dtype it was built for:
    float32, bfloat16 or float16, a compiled head_dim, a causal-only model); asking for
    ``cpu-kernel`` where it does not is a ValueError naming the reason. ``attention_masks``:
    the model's masks the causal kernel lacks (None: none)."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend {requested!r} is not one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if requested == "torch":
        return "torch"
    if requested == "flex":
        if attention_masks is not None:
            raise ValueError(
                "attention_backend 'flex' is not available: its block mask is causal only;"
                f" the model needs {attention_masks}"
            )
        return "flex"
    reason = ""
    if attention_masks is not None:
        reason = f"the CPU kernel is causal only; the model needs {attention_masks}"
        if requested == "auto":
            logger.info("attention: the pure-torch path (%s)", reason)
            return "torch"
    elif device.type != "cpu":
        reason = f"the CPU kernel does not run on {device}"
    elif paged_attention_kernel() is None:
        reason = unavailable_reason()
    elif dtype not in kernel_dtypes():
        names = ", ".join(str(d).removeprefix("torch.") for d in kernel_dtypes())
        reason = f"the CPU kernel has no {str(dtype).removeprefix('torch.')} (has {names})"
    elif head_dim not in kernel_head_dims():
        reason = f"the CPU kernel has no head_dim {head_dim} (has {kernel_head_dims()})"
    if not reason:
        return "cpu-kernel"
    if requested == "cpu-kernel":
        raise ValueError(f"attention_backend 'cpu-kernel' is not available: {reason}")
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16, torch.float16):
        logger.warning("attention: the pure-torch path, not the CPU kernel (%s)", reason)
    return "torch"


def paged_attention(
    layer: int,
    cache: PagedKVCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Write k/v of this step's tokens into the cache, then attend. q: [T, H, D] -> [T, H, D].
    ``sliding_window`` (and ``meta.image_ranges``) need the torch path, which
    ``select_attention_backend`` picks for models declaring ``attention_masks`` (and which
    never run at a fixed shape)."""
    k_cache, v_cache = cache.keys[layer], cache.values[layer]
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    if meta.static_decode is not None:
        assert sliding_window is None and meta.image_ranges is None
        return static_decode_attention(k_cache, v_cache, q, meta.static_decode, scale)
    if meta.use_kernel:
        assert sliding_window is None and meta.image_ranges is None
        tables, starts, lens = meta.block_tables, meta.query_start_loc, meta.seq_lens
        return _kernel(q, k_cache, v_cache, tables, starts, lens, scale, meta.block_size)
    if meta.use_flex:
        assert sliding_window is None and meta.image_ranges is None
        return flex_paged_attention(k_cache, v_cache, q, meta.flex_plan(k_cache.shape[0]), scale)
    plan = meta.torch_plan()
    return torch_paged_attention(k_cache, v_cache, q, k, v, plan, scale, sliding_window)


def _kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    block_size: int,
) -> torch.Tensor:
    """The CPU kernel over these sequences (q's heads made contiguous if they are not)."""
    kernel = paged_attention_kernel()
    assert kernel is not None
    heads_contiguous = q.stride(2) == 1 and q.stride(1) == q.shape[2]
    q = q if heads_contiguous else q.contiguous()
    return kernel(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, block_size)
