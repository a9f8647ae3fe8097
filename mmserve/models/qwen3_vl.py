"""Qwen3-VL (images): the DeepStack vision tower of ``qwen3_vl_vision`` and the Qwen3 decoder
of ``qwen3_vl_text`` (q/k norms, interleaved M-RoPE, DeepStack).

Image inputs, placeholders, checkpoint names and the M-RoPE *positions* of images are
Qwen2-VL's (``Qwen2VLImageProcessor`` with patch_size 16; ``get_rope_index`` of transformers
gives an image's tokens the same (t, h, w) positions), so those parts come from ``qwen2_vl``.

Each image's encoder output is ``[n, hidden_size * (1 + k)]`` (k DeepStack layers): the encoder
cache stores, budgets and slices the wide rows, so a chunk that starts inside an image (after a
prefix hit, a preemption or a chunk boundary) still gets the DeepStack features of exactly its
tokens.

A video is one item per frame group (grid (1, h, w)) whose ``<|video_pad|>`` run sits between
its timestamp text and ``<|vision_end|>`` (``multimodal.qwen3_video``): transformers'
``get_rope_index`` positions each group like a one-frame image, so groups are image spans here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mmserve.inputs import MultiModalItem
from mmserve.layers.linear import Linear
from mmserve.layers.mrope import MRopePositions, mrope_positions
from mmserve.layers.transfer import to_device_like
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.interface import DeepstackInputs
from mmserve.models.llama import LlamaLMHeadMixin
from mmserve.models.qwen2_vl import (
    QWEN2_VL_RENAME_RULES,
    ImageLimits,
    _grid,
    image_limits,
    max_image_tokens,
)
from mmserve.models.qwen3_vl_text import Qwen3VLTextModel
from mmserve.models.vision.qwen2_vl import Grid
from mmserve.models.vision.qwen3_vl import Qwen3VisionTransformer
from mmserve.multimodal.video.qwen3 import load_qwen3_video_settings


def num_deepstack_layers(hf_config: Any) -> int:
    """DeepStack features that reach the decoder (transformers ignores those past its last
    layer)."""
    return min(
        len(hf_config.vision_config.deepstack_visual_indexes),
        hf_config.text_config.num_hidden_layers,
    )


class Qwen3VLForConditionalGeneration(LlamaLMHeadMixin, nn.Module):
    """Model contract of mmserve with M-RoPE (``uses_mrope``) and DeepStack
    (``deepstack_layers``, wide encoder rows; see ``models.interface``)."""

    uses_mrope = True

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        text, vision = hf_config.text_config, hf_config.vision_config
        if vision.out_hidden_size != text.hidden_size:
            raise ValueError(
                f"vision out_hidden_size {vision.out_hidden_size} != text hidden_size"
                f" {text.hidden_size}"
            )
        self.config = hf_config
        self.merge_size = vision.spatial_merge_size
        self.deepstack_layers = num_deepstack_layers(hf_config)
        self.visual = Qwen3VisionTransformer(vision)
        self.language_model = Qwen3VLTextModel(text)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self._set_kv_geometry(text)

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        return max_image_tokens(image_limits(hf_config, processor_kwargs))

    @staticmethod
    def max_tokens_per_video_group(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """A frame group of a two-frame video at the video processor's limits: the largest
        (more frames share the pixel limits)."""
        path = getattr(hf_config, "_name_or_path", "") or ""
        video = load_qwen3_video_settings(path, processor_kwargs)
        low, high = video.per_frame_limits()
        return max_image_tokens(ImageLimits(low, high, video.patch_size, video.merge_size))

    @staticmethod
    def embedding_width(hf_config: Any) -> int:
        return int(hf_config.text_config.hidden_size) * (1 + num_deepstack_layers(hf_config))

    def load_weights(self, checkpoint_dir: Path) -> None:
        load_safetensors(
            self, checkpoint_dir, QWEN2_VL_RENAME_RULES, self.tied_weights(self.config)
        )

    def encode_images(self, images: list[dict[str, Any]]) -> list[torch.Tensor]:
        """One vision pass over the concatenated patches of all images (attention stays within
        each image), sorted by size so equal sizes share one attention call; returns
        [t*h*w / merge**2, hidden * (1 + deepstack_layers)] per image."""
        param = self.lm_head.weight
        grids: list[Grid] = [_grid(d["image_grid_thw"]) for d in images]
        order = sorted(range(len(images)), key=lambda i: grids[i][1] * grids[i][2])
        pixels = torch.cat([torch.as_tensor(np.asarray(images[i]["pixel_values"])) for i in order])
        out = self.visual(to_device_like(pixels, param), [grids[i] for i in order])
        out = out[:, : param.shape[1] * (1 + self.deepstack_layers)]
        sizes = [math.prod(grids[i]) // self.merge_size**2 for i in order]
        by_image = dict(zip(order, out.split(sizes), strict=True))
        return [by_image[i] for i in range(len(images))]

    def forward(
        self, inputs_embeds, positions, cache, meta, deepstack: DeepstackInputs | None = None
    ) -> torch.Tensor:
        return self.language_model(inputs_embeds, positions, cache, meta, deepstack)

    def mrope_positions(
        self, num_tokens: int, mm_items: Sequence[MultiModalItem]
    ) -> MRopePositions:
        """M-RoPE positions of the first ``num_tokens`` tokens (``mmserve.layers.mrope``); a
        video frame group is a one-frame image span, as in transformers' ``get_rope_index``."""
        images = []
        for item in mm_items:
            t, h, w = (int(x) for x in item.data["image_grid_thw"])
            grid = (t, h // self.merge_size, w // self.merge_size)
            if grid[0] * grid[1] * grid[2] != item.length:
                raise ValueError(f"image grid {grid} does not match {item.length} placeholders")
            images.append((item.offset, grid))
        return mrope_positions(num_tokens, images)
