"""transformers as the no-cache reference: model + inputs built without torchvision.

LLaVA uses its own ``AutoProcessor`` (CLIP PIL image processor). Qwen2-VL's and Qwen2.5-VL's
``AutoProcessor`` need torchvision (their video processor), so their inputs are built like the
parity tests do: ``Qwen2VLImageProcessorPil`` + tokenizer, one ``<|image_pad|>`` per merged
patch, and ``mm_token_type_ids`` (1 at image-pad tokens) for the M-RoPE positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

# Qwen2.5-VL and Qwen3-VL ship Qwen2-VL's image processor and placeholders
QWEN_VL = (
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
)


class HFInputs:
    """Builds ``generate`` inputs for a prompt (placeholders unexpanded) and its images."""

    def __init__(
        self, path: Path, architecture: str, processor_kwargs: dict[str, Any] | None = None
    ) -> None:
        from transformers import AutoProcessor, AutoTokenizer

        from mmserve.engine.setup.loading import load_image_processor

        kwargs = dict(processor_kwargs or {})
        self.architecture = architecture
        if architecture in QWEN_VL:
            from transformers import Qwen2VLImageProcessorPil

            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, **kwargs)
            pad_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
            assert isinstance(pad_id, int)
            self.pad_id = pad_id
            self.processor = None
        elif architecture == "LlavaOnevisionForConditionalGeneration":
            from mmserve.models.tiny.families.llava_onevision import load_onevision_processor

            self.processor = load_onevision_processor(path)  # AutoProcessor needs torchvision
            self.tokenizer = self.processor.tokenizer
        else:  # the PIL image processor, as the engine's (AutoProcessor picks torchvision's)
            pil = load_image_processor(path, kwargs)
            self.processor = AutoProcessor.from_pretrained(path, image_processor=pil)
            self.tokenizer = self.processor.tokenizer

    def __call__(self, prompt: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        if self.processor is not None:
            # one prompt's images are one sample (OneVision takes several in its multi-image mode)
            onevision = self.architecture == "LlavaOnevisionForConditionalGeneration"
            sample = [images] if images and onevision else images or None
            return dict(self.processor(text=prompt, images=sample, return_tensors="pt"))
        ids = self.tokenizer(prompt)["input_ids"]
        kwargs: dict[str, torch.Tensor] = {}
        if images:
            out = self.image_processor(images=images, return_tensors="pt")
            merge = self.image_processor.merge_size**2
            counts = iter((out["image_grid_thw"].prod(-1) // merge).tolist())
            ids = [t for i in ids for t in ([i] * next(counts) if i == self.pad_id else [i])]
            kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        input_ids = torch.tensor([ids])
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": torch.eq(input_ids, self.pad_id).int(),
            **kwargs,
        }


class FirstTokenTimer:
    """A ``generate`` streamer that notes when the first new token arrives (``put`` is called
    once with the prompt, then once per generated token)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.calls = 0
        self.first_token_time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_time is None:
            self.first_token_time = self.clock()

    def end(self) -> None:
        pass


class HFReference:
    """A transformers VLM (float32 on the CPU unless told otherwise) with an encoder timer on
    its vision tower; ``inputs`` builds host tensors, ``generate`` moves them to ``device``."""

    def __init__(
        self,
        model: str,
        processor_kwargs: dict[str, Any] | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoConfig, AutoModelForImageTextToText

        from mmserve.models.tiny import resolve_model_path

        path = resolve_model_path(model)
        arch = (AutoConfig.from_pretrained(path).architectures or [""])[0]
        self.inputs = HFInputs(path, arch, processor_kwargs)
        self.tokenizer = self.inputs.tokenizer
        self.device = torch.device(device)
        self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).eval()
        torch.nn.Module.to(self.model, self.device)  # transformers' typed ``to`` confuses mypy
        self.encoder_seconds = 0.0
        inner = self.model.model
        vision = getattr(inner, "visual", None) or getattr(inner, "vision_tower", None)
        if vision is not None:
            vision.register_forward_pre_hook(self._start)
            vision.register_forward_hook(self._stop)
        # ignore_eos semantics of the other engines: never stop early, never mask eos
        self.gen_config = self.model.generation_config
        self.gen_config.eos_token_id = None

    def _start(self, module: Any, args: Any) -> None:
        import time

        self._t0 = time.perf_counter()

    def _stop(self, module: Any, args: Any, output: Any) -> None:
        import time

        self.encoder_seconds += time.perf_counter() - self._t0

    def generate(
        self, inputs: dict[str, torch.Tensor], max_new_tokens: int, clock: Any
    ) -> tuple[list[int], float | None]:
        """Greedy ``max_new_tokens`` tokens; returns (new token ids, first-token time)."""
        timer = FirstTokenTimer(clock)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.inference_mode():
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                streamer=timer,
                generation_config=self.gen_config,
            )
        return out[0, inputs["input_ids"].shape[1] :].tolist(), timer.first_token_time
