"""Gemma 3 (images): SigLIP tower (``last_hidden_state``) + multimodal projector (average pool
to ``mm_tokens_per_image``, RMSNorm, projection) + Gemma 3's decoder.

Its attention needs more than a causal mask: local layers have a sliding window and an
image's tokens attend to each other bidirectionally (``image_attention``), so it declares
``attention_masks`` and runs the torch attention path, and the engine never splits an image
across prefill chunks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mmserve.layers.linear import Linear
from mmserve.layers.norm import RMSNorm
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.gemma3_text import NORM_OFFSET, Gemma3TextModel
from mmserve.models.llama import LlamaLMHeadMixin
from mmserve.models.vision.siglip import SiglipVisionTower

# checkpoint key -> module name: transformers-5 layout and the hub's (google/gemma-3-*-it).
GEMMA3_RENAME_RULES = [
    (r"^model\.language_model\.", "language_model."),
    (r"^model\.vision_tower\.vision_model\.", "vision_tower."),
    (r"^model\.multi_modal_projector\.", "multi_modal_projector."),
    (r"^language_model\.model\.", "language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^vision_tower\.vision_model\.", "vision_tower."),
]


class Gemma3MultiModalProjector(nn.Module):
    """[B, patches, vision_hidden] -> [B, mm_tokens_per_image, text_hidden]."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        vision, text = config.vision_config, config.text_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(vision.hidden_size, text.hidden_size)
        )
        self.mm_soft_emb_norm = RMSNorm(vision.hidden_size, vision.layer_norm_eps, NORM_OFFSET)
        self.patches_per_side = vision.image_size // vision.patch_size
        tokens_per_side = int(config.mm_tokens_per_image**0.5)
        if tokens_per_side**2 != config.mm_tokens_per_image or (
            self.patches_per_side % tokens_per_side
        ):
            raise ValueError(
                f"mm_tokens_per_image={config.mm_tokens_per_image} must be a square whose side"
                f" divides the {self.patches_per_side} patches per side"
            )
        self.kernel = self.patches_per_side // tokens_per_side

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        batch, _, dim = feats.shape
        grid = feats.transpose(1, 2).reshape(batch, dim, self.patches_per_side, -1)
        pooled = nn.functional.avg_pool2d(grid, self.kernel, self.kernel)
        normed = self.mm_soft_emb_norm(pooled.flatten(2).transpose(1, 2))
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(feats)


class Gemma3ForConditionalGeneration(LlamaLMHeadMixin, nn.Module):
    """Model contract (``interface.VisionLanguageModel``) for Gemma 3 with images: the
    Llama text half (``LlamaLMHeadMixin``) with Gemma's masks and embeddings."""

    language_model: Gemma3TextModel
    image_attention = "bidirectional"
    attention_masks: str | None = (
        "Gemma 3's sliding-window layers and bidirectional attention within an image"
    )

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.config = hf_config
        text = hf_config.text_config
        self.vision_tower = SiglipVisionTower(hf_config.vision_config, -1, post_layernorm=True)
        self.multi_modal_projector = Gemma3MultiModalProjector(hf_config)
        self.language_model = Gemma3TextModel(text)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        if self._tied:
            self.lm_head.weight = self.language_model.embed_tokens.weight
        self.image_token_id = hf_config.image_token_id
        self.vocab_size = text.vocab_size
        self._set_kv_geometry(text)

    @property
    def _tied(self) -> bool:
        text = self.config.text_config
        return bool(getattr(self.config, "tie_word_embeddings", text.tie_word_embeddings))

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        return int(hf_config.mm_tokens_per_image)

    def load_weights(self, checkpoint_dir: Path) -> None:
        tied = {"lm_head.weight": "language_model.embed_tokens.weight"} if self._tied else {}
        load_safetensors(
            self,
            checkpoint_dir,
            GEMMA3_RENAME_RULES,
            tied,
            skip=self.vision_tower.skipped_weights("vision_tower."),
        )

    def encode_images(self, pixel_values: list[Any]) -> list[torch.Tensor]:
        """One batched vision pass; [mm_tokens_per_image, hidden] per image."""
        param = self.multi_modal_projector.mm_input_projection_weight
        batch = torch.stack([torch.as_tensor(np.asarray(p)) for p in pixel_values]).to(
            device=param.device, dtype=param.dtype
        )
        return list(self.multi_modal_projector(self.vision_tower(batch)))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.image_token_id >= self.vocab_size:  # out of the vocabulary: rows replaced later
            token_ids = token_ids.masked_fill(token_ids == self.image_token_id, 0)
        return self.language_model.embed(token_ids)
