"""LLaVA-1.5: CLIP vision tower up to its feature layer + MLP projector + mmserve's Llama."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.activations import ACT2FN

from mmserve.layers.linear import Linear
from mmserve.layers.transfer import to_device_like
from mmserve.models.checkpoint.loader import load_safetensors
from mmserve.models.llama import LlamaLMHeadMixin, LlamaModel
from mmserve.models.vision.clip import CLIPVisionTower

# checkpoint key -> module name; covers transformers-5 layout and the hub's older one.
LLAVA_RENAME_RULES = [
    (r"^model\.language_model\.", "language_model."),
    (r"^model\.vision_tower\.", "vision_tower."),
    (r"^model\.multi_modal_projector\.", "multi_modal_projector."),
    (r"^language_model\.model\.", "language_model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^vision_tower\.vision_model\.", "vision_tower."),
]


class LlavaProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = Linear(vision_hidden, text_hidden, bias=bias)
        self.act = ACT2FN[act]
        self.linear_2 = Linear(text_hidden, text_hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(LlamaLMHeadMixin, nn.Module):
    """Model contract used by the runner: ``encode_images``, ``embed``, ``forward``,
    ``compute_logits`` and the KV geometry (``num_layers``, ``num_kv_heads``, ``head_dim``)."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        if not isinstance(hf_config.vision_feature_layer, int):
            raise ValueError("LLaVA with several vision_feature_layer values is not supported")
        self.config = hf_config
        text, vision = hf_config.text_config, hf_config.vision_config
        self.vision_tower = CLIPVisionTower(vision, hf_config.vision_feature_layer)
        self.multi_modal_projector = LlavaProjector(
            vision.hidden_size,
            text.hidden_size,
            hf_config.projector_hidden_act,
            getattr(hf_config, "multimodal_projector_bias", True),
        )
        self.language_model = LlamaModel(text)
        self.lm_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self._set_kv_geometry(text)

    @staticmethod
    def max_tokens_per_image(hf_config: Any, processor_kwargs: dict | None = None) -> int:
        vision = hf_config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        return patches + (1 if hf_config.vision_feature_select_strategy == "full" else 0)

    def load_weights(self, checkpoint_dir) -> None:
        load_safetensors(
            self,
            checkpoint_dir,
            LLAVA_RENAME_RULES,
            self.tied_weights(self.config),
            skip=self.vision_tower.skipped_weights("vision_tower."),
        )

    def encode_images(self, pixel_values: list[Any]) -> list[torch.Tensor]:
        """One batched vision pass; returns [num_embeddings, hidden] per image."""
        param = self.multi_modal_projector.linear_1.weight
        batch = to_device_like(
            torch.stack([torch.as_tensor(np.asarray(p)) for p in pixel_values]), param
        )
        feats = self.vision_tower(batch)  # hidden_states[vision_feature_layer]
        if self.config.vision_feature_select_strategy == "default":
            feats = feats[:, 1:]
        return list(self.multi_modal_projector(feats))
