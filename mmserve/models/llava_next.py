"""LLaVA-NeXT (LLaVA-1.6): LLaVA-OneVision's anyres packing without its ``anyres_max_N``
shrink (the config has no ``vision_aspect_ratio``), a CLIP tower whose CLS token the "default"
strategy drops, and a Llama-style decoder."""

from __future__ import annotations

from typing import Any

from mmserve.models.llava_onevision import AnyresLlava
from mmserve.models.vision.clip import CLIPVisionTower


class LlavaNextForConditionalGeneration(AnyresLlava):
    """CLIP up to ``vision_feature_layer`` + projector + anyres packing + Llama."""

    def make_vision_tower(self, hf_config: Any) -> CLIPVisionTower:
        if not self.drop_cls:
            raise ValueError(
                "LLaVA-NeXT's anyres grid needs the CLIP CLS token dropped:"
                " vision_feature_select_strategy must be 'default', got 'full'"
            )
        return CLIPVisionTower(hf_config.vision_config, hf_config.vision_feature_layer)
