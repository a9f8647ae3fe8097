"""LLaVA-OneVision: SigLIP tower + MLP projector + anyres packing with ``image_newline`` +
Qwen2 decoder (mmserve's Llama with q/k/v biases). ``AnyresLlava`` is the part LLaVA-NeXT
(``llava_next.py``) shares.

An image's data is its processor crops (base first) and its (height, width); ``encode_images``
runs every crop of every image through the tower as one batch, then packs each image's crops
into one ``[num_tokens, hidden]`` tensor as transformers' ``pack_image_features`` does, with the
geometry of ``multimodal.anyres`` (which also counts the placeholders at admission). An image of
a multi-image prompt (OneVision, data marked ``base_only``) has its one crop: its embeddings and
one ``image_newline``, as ``pack_image_features`` packs an image without a grid.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmserve.layers.linear import Linear
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.llama import LlamaLMHeadMixin, LlamaModel
from mmserve.models.llava import LLAVA_RENAME_RULES, LlavaProjector
from mmserve.models.vision.siglip import SiglipVisionTower
from mmserve.multimodal.image.anyres import AnyresGeometry
from mmserve.multimodal.video.onevision import pooled_frame_tokens

ANYRES_RENAME_RULES = [(r"^model\.image_newline$", "image_newline"), *LLAVA_RENAME_RULES]


class AnyresPacker(nn.Module):
    """Crops' embeddings -> one image's packed embeddings: base crop, then the unpadded (and,
    for OneVision, shrunk) feature map row by row, ``image_newline`` after each row."""

    def __init__(self, geometry: AnyresGeometry, hidden: int) -> None:
        super().__init__()
        self.geometry = geometry
        self.image_newline = nn.Parameter(torch.empty(hidden))

    def forward(self, crops: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """``crops``: [1 + rows * cols, patches**2, hidden] (base first)."""
        geo, (height, width) = self.geometry, image_size
        rows, cols = geo.grid(height, width)
        p, hidden = geo.patches, crops.shape[-1]
        if crops.shape[0] != 1 + rows * cols or crops.shape[1] != p * p:
            raise ValueError(
                f"{crops.shape[0]} crops of {crops.shape[1]} embeddings for a {height}x{width}"
                f" image; its grid is 1 + {rows}x{cols} crops of {p * p}"
            )
        grid = crops[1:].view(rows, cols, p, p, hidden).permute(4, 0, 2, 1, 3)
        grid = grid.reshape(hidden, rows * p, cols * p)
        feat_h, feat_w = geo.unpadded(height, width)
        top, left = (rows * p - feat_h) // 2, (cols * p - feat_w) // 2
        grid = grid[:, top : top + feat_h, left : left + feat_w]
        out_h, out_w = geo.pooled(feat_h, feat_w)
        if (out_h, out_w) != (feat_h, feat_w):
            grid = F.interpolate(grid[None], [out_h, out_w], mode="bilinear")[0]
        newline = self.image_newline.to(grid.dtype)[:, None, None].expand(hidden, out_h, 1)
        packed = torch.cat((grid, newline), dim=-1).flatten(1, 2).transpose(0, 1)
        return torch.cat((crops[0], packed))

    def base_only(self, crops: torch.Tensor) -> torch.Tensor:
        """``crops``: [1, patches**2, hidden] (the multi-image mode's one crop) -> its
        embeddings followed by ``image_newline``."""
        p = self.geometry.patches
        if crops.shape[:2] != (1, p * p):
            raise ValueError(
                f"{crops.shape[0]} crops of {crops.shape[1]} embeddings for an image of a"
                f" multi-image prompt; expected 1 crop of {p * p}"
            )
        return torch.cat((crops[0], self.image_newline.to(crops.dtype)[None]))


class AnyresLlava(LlamaLMHeadMixin, nn.Module):
    """mmserve's model contract (see ``LlavaForConditionalGeneration``) for anyres images:
    vision tower -> projector -> ``AnyresPacker``. Subclasses pick the tower (its output per
    crop, after the feature select strategy, must be the crop's patches) and the decoder."""

    qkv_bias: bool | None = None  # None: the text config's attention_bias

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        text, vision = hf_config.text_config, hf_config.vision_config
        if not isinstance(hf_config.vision_feature_layer, int):
            raise ValueError(f"{type(self).__name__} with several vision_feature_layer values")
        if getattr(text, "use_sliding_window", False):
            raise ValueError(f"{type(self).__name__} with sliding-window attention")
        self.config = hf_config
        self.drop_cls = hf_config.vision_feature_select_strategy == "default"
        self.vision_tower = self.make_vision_tower(hf_config)
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size,
            text.hidden_size,
            hf_config.projector_hidden_act,
            getattr(hf_config, "multimodal_projector_bias", True),
        )
        self.packer = AnyresPacker(AnyresGeometry.from_config(hf_config), text.hidden_size)
        self.language_model = LlamaModel(text, qkv_bias=self.qkv_bias)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self._set_kv_geometry(text)

    def make_vision_tower(self, hf_config: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        return AnyresGeometry.from_config(hf_config).max_tokens()

    def load_weights(self, checkpoint_dir) -> None:
        load_safetensors(
            self,
            checkpoint_dir,
            [*ANYRES_RENAME_RULES, (r"^image_newline$", "packer.image_newline")],
            self.tied_weights(self.config),
            skip=self.vision_tower.skipped_weights("vision_tower."),
        )

    def encode_images(self, images: list[dict[str, Any]]) -> list[torch.Tensor]:
        """One tower pass over every crop of every image; [num_tokens, hidden] per image."""
        param = self.multi_modal_projector.linear_1.weight
        crops = [torch.as_tensor(np.asarray(d["pixel_values"])) for d in images]
        batch = torch.cat(crops).to(device=param.device, dtype=param.dtype)
        feats = self.vision_tower(batch)
        feats = self.multi_modal_projector(feats[:, 1:] if self.drop_cls else feats)
        per_image = feats.split([len(c) for c in crops])
        return [
            self.packer(f, tuple(d["image_size"])) for f, d in zip(per_image, images, strict=True)
        ]


def pool_frames(feats: torch.Tensor) -> torch.Tensor:
    """``apply_pooling``: [frames, P*P, hidden] -> [frames * ceil(P/2)**2, hidden]."""
    frames, patches, hidden = feats.shape
    side = math.isqrt(patches)
    grid = feats.view(frames, side, side, hidden).permute(0, 3, 1, 2).contiguous()
    half = math.ceil(side / 2)
    grid = F.interpolate(grid, size=[half, half], mode="bilinear")
    return grid.permute(0, 2, 3, 1).reshape(-1, hidden)


class LlavaOnevisionForConditionalGeneration(AnyresLlava):
    """LLaVA-OneVision: SigLIP (no CLS: the "full" strategy) and a Qwen2 decoder. Videos
    arrive one frame per item (``multimodal.onevision_video``): its pooled embeddings, the
    last frame's followed by ``image_newline`` (transformers' ``get_video_features``). Images
    of a multi-image prompt arrive ``base_only`` (``multimodal.anyres``)."""

    qkv_bias = True

    @staticmethod
    def max_tokens_per_video_group(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """One frame's pooled embeddings plus the newline the last frame carries."""
        return pooled_frame_tokens(hf_config) + 1

    def encode_images(self, images: list[dict[str, Any]]) -> list[torch.Tensor]:
        """One tower pass over every image crop and video frame; [num_tokens, hidden] each."""
        param = self.multi_modal_projector.linear_1.weight
        pixels = [
            torch.as_tensor(np.asarray(d.get("pixel_values_videos", d.get("pixel_values"))))
            for d in images
        ]
        batch = torch.cat(pixels).to(device=param.device, dtype=param.dtype)
        feats = self.multi_modal_projector(self.vision_tower(batch))
        out = []
        for f, d in zip(feats.split([len(p) for p in pixels]), images, strict=True):
            if d.get("base_only"):
                out.append(self.packer.base_only(f))
                continue
            if "pixel_values_videos" not in d:
                out.append(self.packer(f, tuple(d["image_size"])))
                continue
            pooled = pool_frames(f)
            if d["newline"]:
                newline = self.packer.image_newline.to(pooled.dtype)[None]
                pooled = torch.cat((pooled, newline))
            out.append(pooled)
        return out

    def make_vision_tower(self, hf_config: Any) -> SiglipVisionTower:
        if self.drop_cls:
            raise ValueError(
                "LLaVA-OneVision's SigLIP has no CLS token: vision_feature_select_strategy"
                " must be 'full', got 'default'"
            )
        return SiglipVisionTower(hf_config.vision_config, hf_config.vision_feature_layer)
