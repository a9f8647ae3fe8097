"""HF ``architectures`` name -> mmserve model class."""

from __future__ import annotations

from typing import Any

from mmserve.models.gemma3 import Gemma3ForConditionalGeneration
from mmserve.models.idefics3 import (
    Idefics3ForConditionalGeneration,
    SmolVLMForConditionalGeneration,
)
from mmserve.models.interface import VisionLanguageModel
from mmserve.models.llava import LlavaForConditionalGeneration
from mmserve.models.llava_next import LlavaNextForConditionalGeneration
from mmserve.models.llava_onevision import LlavaOnevisionForConditionalGeneration
from mmserve.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from mmserve.models.qwen2_vl import Qwen2VLForConditionalGeneration
from mmserve.models.qwen3_vl import Qwen3VLForConditionalGeneration

MODEL_REGISTRY: dict[str, type[VisionLanguageModel]] = {
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
    "Qwen3VLForConditionalGeneration": Qwen3VLForConditionalGeneration,
    "LlavaOnevisionForConditionalGeneration": LlavaOnevisionForConditionalGeneration,
    "LlavaNextForConditionalGeneration": LlavaNextForConditionalGeneration,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "Idefics3ForConditionalGeneration": Idefics3ForConditionalGeneration,
    "SmolVLMForConditionalGeneration": SmolVLMForConditionalGeneration,
}


def resolve_architecture(hf_config: Any) -> tuple[str, type[VisionLanguageModel]]:
    """The first of the config's ``architectures`` mmserve implements, or a ValueError listing
    the supported ones."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in MODEL_REGISTRY:
            return arch, MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported architecture(s) {archs}; supported: {sorted(MODEL_REGISTRY)}")
