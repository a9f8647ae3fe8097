"""Qwen2-VL: vision transformer + patch merger (``qwen2_vl_vision``), mmserve's Qwen2 decoder
with M-RoPE.

Images arrive as the PIL image processor's flat patches plus their (t, h, w) patch grid
(``{"pixel_values": [t*h*w, C*T*p*p], "image_grid_thw": (t, h, w)}``); each image yields
t*h*w / merge_size**2 embeddings, one per ``<|image_pad|>`` token after mmserve's expansion.
A video arrives as one such item per temporal frame group (grid (1, h, w)): the vision tower
attends within a frame group only, so encoding groups one by one is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import Qwen2VLImageProcessorPil

from mmserve.inputs import MultiModalItem
from mmserve.layers.linear import Linear
from mmserve.layers.mrope import MRopePositions, MRotaryEmbedding, VisionSpan, mrope_positions
from mmserve.layers.rotary import rope_theta
from mmserve.layers.transfer import to_device_like
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.llama import LlamaLMHeadMixin, LlamaModel
from mmserve.models.vision.qwen2_vl import Grid, Qwen2VisionTransformer
from mmserve.multimodal.video.qwen2_vl import load_video_settings

# checkpoint key -> module name; covers transformers-5 layout and the hub's older one.
QWEN2_VL_RENAME_RULES = [
    (r"^model\.language_model\.", "language_model."),
    (r"^model\.visual\.", "visual."),
    (r"^model\.(?=(embed_tokens|layers|norm)\.)", "language_model."),
]
MAX_ASPECT_RATIO = 200  # smart_resize rejects more elongated images


@dataclass(frozen=True)
class ImageLimits:
    """The image processor settings that decide how many embeddings an image becomes."""

    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def image_limits(hf_config: Any, processor_kwargs: dict | None = None) -> ImageLimits:
    """Limits of the checkpoint's ``preprocessor_config.json`` overridden by
    ``processor_kwargs`` (loaded exactly as the engine loads the image processor)."""
    kwargs = dict(processor_kwargs or {})
    path = Path(getattr(hf_config, "_name_or_path", "") or "")
    if str(path) and (path / "preprocessor_config.json").is_file():
        proc = Qwen2VLImageProcessorPil.from_pretrained(path, **kwargs)
    else:
        proc = Qwen2VLImageProcessorPil(**kwargs)
    limits = ImageLimits(
        int(proc.size["shortest_edge"]),
        int(proc.size["longest_edge"]),
        int(proc.patch_size),
        int(proc.merge_size),
    )
    vision = hf_config.vision_config
    if (limits.patch_size, limits.merge_size) != (vision.patch_size, vision.spatial_merge_size):
        raise ValueError(
            f"image processor patch_size/merge_size ({limits.patch_size}, {limits.merge_size})"
            f" do not match the vision tower's ({vision.patch_size}, {vision.spatial_merge_size})"
        )
    if not 0 < limits.min_pixels <= limits.max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {limits}")
    return limits


def max_image_tokens(limits: ImageLimits) -> int:
    """The largest embedding count ``smart_resize`` can give any image it accepts.

    Resized sides are multiples of ``factor``; embeddings = h_bar * w_bar / factor**2. Three
    branches: sizes whose rounding lands in [min_pixels, max_pixels] are kept (exact search),
    larger ones are scaled down (floor, but never below one factor: elongated images can exceed
    max_pixels), smaller ones up (ceil, can exceed min_pixels).
    """
    f, p = limits.factor, limits.max_pixels
    m = limits.min_pixels / f**2
    best = 0
    for a in range(1, math.isqrt(p // f**2) + 1):  # kept: round(h/f) = a <= b = round(w/f)
        b = min(p // f**2 // a, _largest_b(a, f))
        if b >= a and a * b * f * f >= limits.min_pixels:
            best = max(best, a * b)
    x_min = math.sqrt(p / MAX_ASPECT_RATIO)  # downscaled: short side x = h / beta >= x_min
    if x_min < 2 * f:
        best = max(best, math.floor(math.sqrt(p * MAX_ASPECT_RATIO) / f))
    for a in range(2, math.isqrt(p) // f + 1):
        x = max(a * f, x_min)
        if x < (a + 1) * f:
            best = max(best, a * math.floor(p / x / f))
    u_min = math.sqrt(m / MAX_ASPECT_RATIO)  # upscaled: ceil(u) * ceil(m / u), u*v = m
    for a in range(max(1, math.ceil(u_min)), math.ceil(math.sqrt(m)) + 1):
        u = max(a - 1, u_min)
        if 0 < u <= a:
            best = max(best, a * math.ceil(m / u))
    return best


def _grid(thw: Any) -> Grid:
    t, h, w = (int(x) for x in thw)
    return t, h, w


def _largest_b(a: int, f: int) -> int:
    """Largest round(w / f) with w <= MAX_ASPECT_RATIO * h for some h with round(h / f) = a."""
    h = math.ceil((a + 0.5) * f)
    while round(h / f) != a:
        h -= 1
    return round(MAX_ASPECT_RATIO * h / f)


class Qwen2VLForConditionalGeneration(LlamaLMHeadMixin, nn.Module):
    """Model contract of mmserve (see ``LlavaForConditionalGeneration``) plus M-RoPE:
    ``uses_mrope`` and ``mrope_positions(num_tokens, mm_items)``."""

    uses_mrope = True

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        text, vision = hf_config.text_config, hf_config.vision_config
        if getattr(text, "use_sliding_window", False):
            raise ValueError("Qwen2-VL with sliding-window attention is not supported")
        self.config = hf_config
        self.merge_size = vision.spatial_merge_size
        self.visual = self.make_vision_tower(vision)
        head_dim = text.hidden_size // text.num_attention_heads
        section = (text.rope_parameters or {}).get("mrope_section", [16, 24, 24])
        rotary = MRotaryEmbedding(head_dim, rope_theta(text), section)
        self.language_model = LlamaModel(text, qkv_bias=True, o_bias=False, rotary_emb=rotary)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self._set_kv_geometry(text)

    @staticmethod
    def make_vision_tower(vision_config: Any) -> nn.Module:
        return Qwen2VisionTransformer(vision_config)

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        return max_image_tokens(image_limits(hf_config, processor_kwargs))

    @staticmethod
    def max_tokens_per_video_group(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """One temporal frame group is one frame's worth of embeddings at the video
        processor's size limits."""
        path = getattr(hf_config, "_name_or_path", "") or ""
        video = load_video_settings(path, processor_kwargs)
        limits = ImageLimits(video.min_pixels, video.max_pixels, video.patch_size, video.merge_size)
        return max_image_tokens(limits)

    def load_weights(self, checkpoint_dir) -> None:
        load_safetensors(
            self, checkpoint_dir, QWEN2_VL_RENAME_RULES, self.tied_weights(self.config)
        )

    def encode_images(self, images: list[dict[str, Any]]) -> list[torch.Tensor]:
        """One vision pass over the concatenated patches of all images (attention stays within
        each image); returns [t*h*w / merge**2, hidden] per image. Images run sorted by size so
        equal sizes share one attention call."""
        param = self.lm_head.weight
        grids: list[Grid] = [_grid(d["image_grid_thw"]) for d in images]
        order = sorted(range(len(images)), key=lambda i: grids[i][1] * grids[i][2])
        pixels = torch.cat([torch.as_tensor(np.asarray(images[i]["pixel_values"])) for i in order])
        out = self.visual(to_device_like(pixels, param), [grids[i] for i in order])
        sizes = [math.prod(grids[i]) // self.merge_size**2 for i in order]
        by_image = dict(zip(order, out.split(sizes), strict=True))
        return [by_image[i] for i in range(len(images))]

    def video_time_interval(self, second_per_grid_t: float) -> float:
        """Temporal M-RoPE step between a video's frame groups: 1 (Qwen2-VL)."""
        return 1.0

    def mrope_positions(
        self, num_tokens: int, mm_items: Sequence[MultiModalItem]
    ) -> MRopePositions:
        """M-RoPE positions of the first ``num_tokens`` tokens (``mmserve.layers.mrope``); a
        video's frame-group items form one span (its first group starts it)."""
        spans: list[VisionSpan] = []
        video_start = 0
        for item in mm_items:
            t, h, w = (int(x) for x in item.data["image_grid_thw"])
            grid = (t, h // self.merge_size, w // self.merge_size)
            if grid[0] * grid[1] * grid[2] != item.length:
                raise ValueError(f"image grid {grid} does not match {item.length} placeholders")
            group = item.video
            if group is None:
                spans.append((item.offset, grid))
                continue
            if group.index == 0:
                video_start = item.offset
                interval = self.video_time_interval(group.second_per_grid_t)
                spans.append((item.offset, (group.num_groups, grid[1], grid[2]), interval))
            if item.offset != video_start + group.index * item.length:
                raise ValueError(f"video frame group {group.index} at {item.offset} is misplaced")
        return mrope_positions(num_tokens, spans)
