"""SmolVLM / SmolVLM2 (the Idefics3 architecture): Idefics3 vision tower (SigLIP) over every
tile of an image + connector (pixel shuffle by ``scale_factor``, then one bias-free
projection) + mmserve's Llama.

An image (a SmolVLM2 video alike: ``multimodal.video.smolvlm_prep``) is one encoder item
spanning its whole prompt text (``multimodal.image.idefics3``):
its data holds the tiles (the global image last) and ``span_ids``, the text's token ids.
``encode_images`` returns one row per span position: the text embedding of each tag and
newline, and the tiles' embeddings, in order, at the ``<image>`` positions; this is what
transformers' ``inputs_embeds.masked_scatter`` builds, so the runner's splice of the whole span
changes nothing but the image rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mmserve.layers.linear import Linear
from mmserve.layers.transfer import to_device_like
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.llama import LlamaLMHeadMixin, LlamaModel
from mmserve.models.vision.idefics3 import Idefics3VisionTower
from mmserve.multimodal.image.idefics3 import image_seq_len, max_span_tokens
from mmserve.multimodal.video.smolvlm import SmolVideoSampling, declares_video
from mmserve.multimodal.video.smolvlm_prep import max_video_tokens

# checkpoint key -> module name; Idefics3ForConditionalGeneration's and SmolVLM's alike.
IDEFICS3_RENAME_RULES = [
    (r"^model\.text_model\.", "language_model."),
    (r"^model\.vision_model\.", "vision_tower."),
    (r"^model\.connector\.", "connector."),
]


def pixel_shuffle(feats: torch.Tensor, scale: int) -> torch.Tensor:
    """``Idefics3Connector.pixel_shuffle``: [B, side**2, dim] -> [B, side**2 / scale**2,
    dim * scale**2], each output row ``scale x scale`` neighbouring patches."""
    batch, seq, dim = feats.shape
    side = math.isqrt(seq)
    x = feats.view(batch, side, side // scale, dim * scale).permute(0, 2, 1, 3)
    x = x.reshape(batch, side // scale, side // scale, dim * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(batch, seq // scale**2, dim * scale**2)


class Idefics3Connector(nn.Module):
    """[tiles, patches, vision_hidden] -> [tiles, image_seq_len, text_hidden]."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.scale_factor = int(config.scale_factor)
        vision, text = config.vision_config, config.text_config
        side = vision.image_size // vision.patch_size
        if side % self.scale_factor:
            raise ValueError(
                f"scale_factor {self.scale_factor} must divide the {side} patches a tile side"
            )
        width = vision.hidden_size * self.scale_factor**2
        self.modality_projection = nn.ModuleDict(
            {"proj": Linear(width, text.hidden_size, bias=False)}
        )

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.modality_projection["proj"](pixel_shuffle(feats, self.scale_factor))


class Idefics3ForConditionalGeneration(LlamaLMHeadMixin, nn.Module):
    """mmserve's model contract (``interface.VisionLanguageModel``) for SmolVLM: the Llama text
    half (``LlamaLMHeadMixin``), causal attention, an image per encoder item (tiles included)."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.config = hf_config
        text = hf_config.text_config
        self.vision_tower = Idefics3VisionTower(hf_config.vision_config)
        self.connector = Idefics3Connector(hf_config)
        self.language_model = LlamaModel(text)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self.image_token_id = int(hf_config.image_token_id)
        self.image_seq_len = image_seq_len(hf_config)
        self._set_kv_geometry(text)

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """The longest text of one image (its item spans it all)."""
        return max_span_tokens(hf_config, processor_kwargs)

    @staticmethod
    def max_tokens_per_video_group(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        """A video's item spans all its frames (``video.smolvlm_prep``): the longest at the
        sampling's ``max_frames``; 0 unless the checkpoint's processor declares video."""
        path = getattr(hf_config, "_name_or_path", "") or ""
        if not declares_video(path):
            return 0
        sampling = SmolVideoSampling.from_checkpoint(Path(path), None, processor_kwargs or {})
        return max_video_tokens(image_seq_len(hf_config), sampling.max_frames)

    def load_weights(self, checkpoint_dir: Path) -> None:
        load_safetensors(
            self,
            checkpoint_dir,
            IDEFICS3_RENAME_RULES,
            self.tied_weights(self.config),
            skip=self.vision_tower.skipped_weights("vision_tower."),
        )

    def encode_images(self, images: list[dict[str, Any]]) -> list[torch.Tensor]:
        """One tower pass over every tile of every image; per image [len(span_ids), hidden]:
        the span's text embeddings with the tile embeddings at its ``<image>`` positions."""
        param = self.lm_head.weight
        tiles = [torch.as_tensor(np.asarray(d["pixel_values"])) for d in images]
        spans = [np.asarray(d["span_ids"]) for d in images]
        for span, t in zip(spans, tiles, strict=True):
            if int((span == self.image_token_id).sum()) != len(t) * self.image_seq_len:
                raise ValueError(
                    f"an image of {len(t)} tiles ({len(t) * self.image_seq_len} embeddings)"
                    f" has {int((span == self.image_token_id).sum())} <image> tokens"
                )
        feats = self.connector(self.vision_tower(to_device_like(torch.cat(tiles), param)))
        out = []
        for f, span in zip(feats.split([len(t) for t in tiles]), spans, strict=True):
            ids = torch.as_tensor(span).to(param.device)
            rows = self.language_model.embed(ids)
            out.append(rows.masked_scatter((ids == self.image_token_id)[:, None], f))
        return out


class SmolVLMForConditionalGeneration(Idefics3ForConditionalGeneration):
    """SmolVLM2's architecture name: the same model and checkpoint layout; a video's frames
    are tiles of one item, encoded as an image's."""
