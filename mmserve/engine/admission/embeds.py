"""Precomputed image embeddings (``ImageEmbeds``, vLLM's ``image_embeds`` input) admitted as
images whose encoder output is already known.

Each one becomes a ``PreparedImage`` whose content hash is a hash of the tensor (its bytes,
dtype and shape) and of the model, so it is keyed, prefix-cached and encoder-cached like an
image: sending the same tensor twice hits both caches. Its processor output is that of a blank
image of the size the embeddings stand for (so placeholders and M-RoPE positions come out as
for a real image), without pixels; the item is marked ``by_handle`` and its embedding is
supplied at admission, so it is never encoded. The embedding count must be the one an image
takes in this model: the fixed count of fixed-resolution families, or for families whose count
depends on the image size, the count its ``image_grid_thw`` gives (Qwen-VL); any other
shape is a ``ValueError`` naming it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
from typing import Any

import numpy as np
import torch
from PIL import Image

from mmserve.engine.admission.handles import resolved
from mmserve.inputs import ImageEmbeds, ProcessedPrompt, PromptInput
from mmserve.multimodal.handles import HandleRecord
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.processor import InputProcessor

PROBE_SIZES = ((336, 336), (672, 336))  # two blank images: the count is fixed if both agree
Future = concurrent.futures.Future


def prepare_embeds(
    processor: InputProcessor, prompt: PromptInput, dtype: torch.dtype, width: int
) -> tuple[PromptInput, dict[str, torch.Tensor]]:
    """``prompt`` with each ``ImageEmbeds`` replaced by its ``PreparedImage``, and each such
    image's item key -> its embedding (``dtype``, ``width`` columns checked)."""
    if not any(isinstance(image, ImageEmbeds) for image in prompt.images):
        return prompt, {}
    if prompt.uuids is not None and any(
        u is not None and isinstance(s, ImageEmbeds)
        for s, u in zip(prompt.images, prompt.uuids, strict=True)
    ):
        raise ValueError("image_embeds take no uuid: they are keyed by their content")
    multi_image = processor.preparer.multi_image(len(prompt.images))
    images, found = list(prompt.images), {}
    max_rows = max_embeds_rows(processor)
    for i, image in enumerate(images):
        if isinstance(image, ImageEmbeds):
            tensor = _checked_tensor(image.embeds, width, max_rows).to(dtype)
            prepared = _prepared(processor, image, tensor, prompt, multi_image)
            images[i] = prepared
            found[processor.item_key(prepared, None, prompt.cache_salt)] = tensor
    return dataclasses.replace(prompt, images=images), found


def supply_embeds(processed: ProcessedPrompt, found: dict[str, torch.Tensor]) -> dict[str, Future]:
    """Mark the items of ``found``'s keys ``by_handle`` (loaded, never encoded) and return
    their embeddings (item key -> resolved future, as a store lookup gives them)."""
    futures: dict[str, Future] = {}
    items = processed.mm_items
    for idx, item in enumerate(items):
        tensor = found.get(item.hash.split("#", 1)[0]) if item.video is None else None
        if tensor is None:
            continue
        items[idx] = dataclasses.replace(item, by_handle=True)
        futures[item.key] = resolved(tensor)
    return futures


def check_embeds_shape(embeds: Any, width: int, max_rows: int) -> torch.Tensor:
    """``embeds`` as a ``(tokens, width)`` tensor if it is a dense floating one of at most
    ``max_rows`` rows (a leading batch dimension of 1 dropped), else a ValueError naming what
    is wrong. It reads only the tensor's metadata: no data is touched, nothing is allocated
    (an expanded view of a few bytes may claim any number of rows)."""
    if not isinstance(embeds, torch.Tensor):
        raise ValueError(f"image_embeds must be a torch.Tensor, got {type(embeds).__name__}")
    if embeds.layout != torch.strided or embeds.is_nested:  # vLLM's sparse-tensor CVE
        layout = "nested" if embeds.is_nested else embeds.layout
        raise ValueError(f"image_embeds must be a dense tensor, got layout {layout}")
    if embeds.dim() == 3 and embeds.shape[0] == 1:
        embeds = embeds[0]
    if embeds.dim() != 2 or not embeds.is_floating_point() or embeds.shape[1] != width:
        raise ValueError(
            f"image_embeds must be a floating (tokens, {width}) tensor for this model, got"
            f" {embeds.dtype} {tuple(embeds.shape)}"
        )
    if embeds.shape[0] > max_rows:
        raise ValueError(
            f"image_embeds has {embeds.shape[0]} rows, an image takes at most {max_rows} here"
        )
    return embeds


def _checked_tensor(embeds: Any, width: int, max_rows: int) -> torch.Tensor:
    embeds = check_embeds_shape(embeds, width, max_rows)
    if embeds.shape[0] == 0 or not bool(torch.isfinite(embeds).all()):
        raise ValueError("image_embeds must be non-empty and finite")
    return embeds.detach().to("cpu").contiguous()


def max_embeds_rows(processor: InputProcessor) -> int:
    """The most rows one image's embeddings may have in this model (its largest image)."""
    mc = processor.model_config
    return mc.max_tokens_per_image or mc.max_model_len


def _grid(grid: Any) -> list[int]:
    """An ``image_grid_thw`` as a list of ints; a tensor is checked before it is read."""
    if isinstance(grid, torch.Tensor) and (
        grid.layout != torch.strided or grid.is_nested or grid.numel() != 3
    ):
        raise ValueError(f"image_grid_thw must be one image's (1, h, w) grid, got {grid.shape}")
    values = np.asarray(grid).reshape(-1)
    if values.size != 3 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"image_grid_thw must be one image's (1, h, w) grid, got {grid!r:.80}")
    return [int(v) for v in values]


def _prepared(
    processor: InputProcessor,
    image: ImageEmbeds,
    tensor: torch.Tensor,
    prompt: PromptInput,
    multi_image: bool,
) -> PreparedImage:
    salt, kwargs = prompt.cache_salt, prompt.mm_processor_kwargs

    def blank(size: tuple[int, int]) -> PreparedImage:
        return processor.prepare_image(Image.new("RGB", size), salt, kwargs, multi_image)

    if image.image_grid_thw is not None:
        grid = _grid(image.image_grid_thw)
        patch = int(getattr(processor.preparer.image_processor, "patch_size", 0) or 0)
        if len(grid) != 3 or grid[0] != 1 or not patch or min(grid) < 1:
            raise ValueError(f"image_grid_thw {grid} is not one image's (1, h, w) grid here")
        probe = blank((grid[2] * patch, grid[1] * patch))
        made = np.asarray(probe.data.get("image_grid_thw", [])).reshape(-1).tolist()
        if made != grid:
            raise ValueError(f"image_grid_thw {grid} is not a grid this model's processor makes")
    else:
        probe, other = blank(PROBE_SIZES[0]), blank(PROBE_SIZES[1])
        if probe.length != other.length:
            raise ValueError(
                "this model's image token count depends on the image size: image_embeds need"
                " an image_grid_thw here (Qwen-VL), other such families are not supported"
            )
    if probe.length != tensor.shape[0]:
        raise ValueError(
            f"image_embeds has {tensor.shape[0]} rows, the image it stands for takes"
            f" {probe.length} here"
        )
    digest = hashlib.sha256(
        f"embeds\0{processor.model_config.model}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode()
    )
    digest.update(tensor.view(torch.uint8).numpy().data)  # hashed once, here
    blank_record = HandleRecord.of("", probe, "", "")  # the processor output without pixels
    return dataclasses.replace(blank_record.image, mm_hash=digest.hexdigest())
