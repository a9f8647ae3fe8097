"""What the worker keeps about one request between steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mmserve.inputs import MultiModalItem
from mmserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mmserve.layers.mrope import MRopePositions


@dataclass
class RequestState:
    token_ids: list[int]
    # the scheduler's ``Request.mm_items`` itself: it drops their ``stored`` tensors in place
    mm_items: list[MultiModalItem]
    params: SamplingParams
    block_table: torch.Tensor  # [num_blocks] long, extended as blocks are added
    num_computed_tokens: int
    generator: torch.Generator | None
    # M-RoPE models only: [3, n] positions of the tokens known at admission + decode offset.
    mrope: MRopePositions | None = None
    num_prompt_tokens: int = 0
    matcher: Any = None  # xgrammar matcher of a request with structured outputs
