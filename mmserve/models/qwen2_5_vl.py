"""Qwen2.5-VL (images): Qwen2-VL's decoder, M-RoPE and image inputs with the window-attention
vision tower of ``qwen2_5_vl_vision``.

The checkpoint names, the image processor (``Qwen2VLImageProcessor``), the placeholder expansion
and the M-RoPE positions of images are Qwen2-VL's; only the vision tower differs.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mmserve.models.qwen2_5_vl_vision import Qwen2_5VisionTransformer
from mmserve.models.qwen2_vl import Qwen2VLForConditionalGeneration


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """``Qwen2VLForConditionalGeneration`` with Qwen2.5-VL's vision tower."""

    @staticmethod
    def make_vision_tower(vision_config: Any) -> nn.Module:
        return Qwen2_5VisionTransformer(vision_config)
