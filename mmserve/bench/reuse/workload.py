"""The reuse workload rendered once for all engines: prompt text (the model's chat template)
and the synthetic images its specs name."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from mmserve.bench.lib.images import synthetic_image
from mmserve.bench.lib.workloads import Spec
from mmserve.entrypoints.chat_utils import render_chat
from mmserve.models.tiny import resolve_model_path


class Workload:
    """Specs rendered once for all engines: prompt text (the model's chat template) + images."""

    def __init__(self, model: str, resolution: str | tuple[int, int]) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
        self.resolution = resolution
        self._images: dict[int, Any] = {}

    def prompt(self, spec: Spec) -> str:
        return render_chat(self.tokenizer, spec.messages({"type": "image"}))

    def image(self, seed: int) -> Any:
        if seed not in self._images:
            self._images[seed] = synthetic_image(seed, self.resolution)
        return self._images[seed]

    def requests(self, specs: list[Spec]) -> list[dict[str, Any]]:
        return [{"prompt": self.prompt(s), "images": [self.image(s.image_seed)]} for s in specs]
