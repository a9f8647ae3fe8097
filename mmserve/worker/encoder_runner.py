"""Worker-side encoder cache: encodes scheduled images once and serves embedding slices."""

from __future__ import annotations

import logging
import time

import torch

from mmserve.inputs import MultiModalItem
from mmserve.models.interface import VisionLanguageModel

logger = logging.getLogger(__name__)


class EncoderRunner:
    """Holds image embeddings by ``MultiModalItem.key``, mirroring the scheduler's
    EncoderCacheManager.

    Invariants: an entry's first dimension equals its item's placeholder length; entries are
    dropped when the scheduler reports them evicted, or by ``drop_step_encodes`` when the step
    that encoded them fails (the scheduler rolls the matching allocations back);
    ``num_gather_misses`` counts embeddings missing at gather time (0 unless the two sides
    disagree: each is encoded again, outside the step's budget, and logged).
    """

    def __init__(self, model: VisionLanguageModel) -> None:
        self.model = model
        self.embeddings: dict[str, torch.Tensor] = {}
        self.encoder_seconds = 0.0
        self.num_images_encoded = 0
        self.num_embeddings_computed = 0
        self.num_gather_misses = 0
        self._encoded_this_step: list[str] = []

    def begin_step(self) -> None:
        self._encoded_this_step = []

    def drop_step_encodes(self) -> None:
        """The step failed: forget what it encoded (the scheduler forgets the entries too)."""
        self.drop(self._encoded_this_step)
        self._encoded_this_step = []

    def drop(self, keys: list[str]) -> None:
        for key in keys:
            self.embeddings.pop(key, None)

    def encode(self, items: list[MultiModalItem]) -> None:
        """Encode the items not held yet in one batched call, deduplicated by key."""
        todo: dict[str, MultiModalItem] = {}
        for item in items:
            if item.key not in self.embeddings:
                todo.setdefault(item.key, item)
        if not todo:
            return
        start = time.perf_counter()
        with torch.inference_mode():
            outputs = self.model.encode_images([item.data for item in todo.values()])
        self.encoder_seconds += time.perf_counter() - start
        for item, emb in zip(todo.values(), outputs, strict=True):
            if emb.shape[0] != item.length:
                raise RuntimeError(
                    f"image {item.hash} produced {emb.shape[0]} embeddings but its placeholder"
                    f" has {item.length} tokens"
                )
        for key, emb in zip(todo, outputs, strict=True):
            self.embeddings[key] = emb
            self._encoded_this_step.append(key)
        self.num_embeddings_computed += sum(item.length for item in todo.values())
        self.num_images_encoded += len(todo)

    def get_slice(self, item: MultiModalItem, start: int, end: int) -> torch.Tensor:
        """Embeddings of prompt positions [start, end) that lie inside ``item``."""
        emb = self.embeddings.get(item.key)
        if emb is None:
            logger.error("image %s missing at gather: encoding it again", item.key)
            self.num_gather_misses += 1
            self.encode([item])
            emb = self.embeddings[item.key]
        return emb[start - item.offset : end - item.offset]
