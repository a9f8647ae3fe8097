"""transformers' models as the ground truth the parity tests compare with."""

from __future__ import annotations

import torch
from PIL import Image

from mmserve.engine.setup.loading import load_image_processor
from mmserve.models.tiny import resolve_model_path
from tests.support.engine import engine_device


class Reference:
    """transformers' LlavaForConditionalGeneration + its own processor: the ground truth."""

    def __init__(self, model_name: str) -> None:
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        path = resolve_model_path(model_name)
        self.device = engine_device()
        # The PIL image processor, the one the engine reproduces: where torchvision is installed
        # (the GPU image), AutoProcessor picks the torchvision one, whose resize differs.
        pil = load_image_processor(path, {})
        self.processor = AutoProcessor.from_pretrained(path, image_processor=pil)
        self.model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        self.model.to(self.device).eval()

    def inputs(self, prompt: str, images: list[Image.Image]) -> dict:
        kwargs = {"images": images} if images else {}
        return self.processor(text=prompt, return_tensors="pt", **kwargs).to(self.device)

    def greedy(self, prompt: str, images: list[Image.Image], max_new_tokens: int) -> list[int]:
        inputs = self.inputs(prompt, images)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()
