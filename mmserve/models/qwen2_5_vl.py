"""Qwen2.5-VL (images and videos): Qwen2-VL's decoder, M-RoPE and image inputs with the
window-attention vision tower of ``qwen2_5_vl_vision``.

The checkpoint names, the image processor (``Qwen2VLImageProcessor``), the placeholder expansion
and the M-RoPE positions of images are Qwen2-VL's; the vision tower differs, and so do video
positions (absolute time: ``video_time_interval``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmserve.models.qwen2_vl import Qwen2VLForConditionalGeneration
from mmserve.models.vision.qwen2_5_vl import Qwen2_5VisionTransformer


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """``Qwen2VLForConditionalGeneration`` with Qwen2.5-VL's vision tower."""

    def video_time_interval(self, second_per_grid_t: float) -> float:
        """Absolute-time M-RoPE: ``tokens_per_second * second_per_grid_t``, in float32 as
        transformers computes it from ``second_per_grid_ts``."""
        tokens_per_second = self.config.vision_config.tokens_per_second
        return float(torch.tensor(second_per_grid_t, dtype=torch.float32) * tokens_per_second)

    @staticmethod
    def make_vision_tower(vision_config: Any) -> nn.Module:
        return Qwen2_5VisionTransformer(vision_config)
