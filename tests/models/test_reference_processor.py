"""The transformers references process images with the PIL image processor, the one the engine
reproduces. Where torchvision is installed (the GPU image) ``AutoProcessor`` alone picks the
torchvision processor, whose resize differs: on an H200 a 120x50 image's greedy tokens then
parted from the engine's at token 16 (logprobs 1e-3 apart)."""

from __future__ import annotations

import pytest
import torch

from mmserve.bench.lib.engines.reference import HFInputs
from mmserve.engine.setup.loading import load_image_processor
from mmserve.models.tiny import resolve_model_path
from tests.support.images import make_image
from tests.support.references import Reference


def test_the_llava_references_use_the_engines_image_processor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Here too, AutoImageProcessor is made to pick another class, as torchvision's presence
    makes it do on the GPU image: the references must not follow it."""
    from transformers import CLIPImageProcessorPil
    from transformers.models.auto import image_processing_auto

    class TorchvisionStandIn(CLIPImageProcessorPil):
        pass

    monkeypatch.setattr(
        image_processing_auto.AutoImageProcessor,
        "from_pretrained",
        staticmethod(lambda path, *args, **kwargs: TorchvisionStandIn.from_pretrained(path)),
    )
    path = resolve_model_path("tiny-llava")
    engine_processor = load_image_processor(path, {})
    image = make_image(2, (120, 50))
    expected = torch.as_tensor(engine_processor(image, return_tensors="pt")["pixel_values"])
    for processor in (
        Reference("tiny-llava").processor,
        HFInputs(path, "LlavaForConditionalGeneration").processor,
    ):
        assert type(processor.image_processor) is type(engine_processor)
        pixels = processor(text="USER: <image>\nHi", images=[image], return_tensors="pt")
        assert torch.equal(pixels["pixel_values"], expected)
