"""Worker-side encoder cache: encodes scheduled images once and serves embedding slices."""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch

from mmserve.inputs import MultiModalItem
from mmserve.layers.transfer import to_device
from mmserve.models.interface import VisionLanguageModel

logger = logging.getLogger(__name__)


class EmbeddingSink(Protocol):
    """Where the runner reports embeddings it computed and embeddings the cache evicted
    (the encoder store); both calls must return at once."""

    def encoded(self, item_key: str, tensor: torch.Tensor) -> None: ...

    def evicted(self, item_key: str, tensor: torch.Tensor) -> None: ...


class EncoderRunner:
    """Holds image embeddings by ``MultiModalItem.key``, mirroring the scheduler's
    EncoderCacheManager.

    Invariants: an entry's first dimension equals its item's placeholder length; entries are
    dropped when the scheduler reports them evicted, or by ``drop_step_encodes`` when the step
    that encoded them fails (the scheduler rolls the matching allocations back);
    ``num_gather_misses`` counts embeddings missing at gather time (0 unless the two sides
    disagree: each is encoded again, outside the step's budget, and logged). A scheduled
    *load* copies the item's ``stored`` embedding in (to CUDA from pinned memory without
    blocking; on CPU the stored tensor itself is the entry); one that does not fit its
    placeholder is encoded instead in the same step (``num_load_failures``); the step's
    ``encoded_instead`` names those and the gather misses' keys. The scheduler
    drops ``stored`` once the step ran, so an entry evicted and needed again is scheduled as
    an encode, never as a load. ``sink`` (None: no store) hears of every encoded and every
    evicted embedding.
    """

    def __init__(self, model: VisionLanguageModel, device: torch.device | None = None) -> None:
        self.model = model
        self.device = device if device is not None else torch.device("cpu")
        self.sink: EmbeddingSink | None = None
        self.num_images_loaded = 0
        self.num_load_failures = 0
        self.embeddings: dict[str, torch.Tensor] = {}
        self.encoder_seconds = 0.0
        self.num_images_encoded = 0
        self.num_embeddings_computed = 0
        self.num_gather_misses = 0
        self._encoded_this_step: list[str] = []
        self.encoded_instead: set[str] = set()

    def begin_step(self) -> None:
        self._encoded_this_step = []
        self.encoded_instead = set()

    def drop_step_encodes(self) -> None:
        """The step failed: forget what it encoded (the scheduler forgets the entries too)."""
        self.drop(self._encoded_this_step)
        self._encoded_this_step = []

    def drop(self, keys: list[str]) -> None:
        for key in keys:
            self.embeddings.pop(key, None)

    def evict(self, keys: list[str]) -> None:
        """The scheduler evicted ``keys``: hand them to the sink, then drop them."""
        if self.sink is not None:
            for key in keys:
                emb = self.embeddings.get(key)
                if emb is not None:
                    self.sink.evicted(key, emb)
        self.drop(keys)

    def load(self, items: list[MultiModalItem]) -> list[MultiModalItem]:
        """Copy the items' stored embeddings in; returns those that must be encoded instead."""
        failed = []
        for item in items:
            if item.key in self.embeddings:
                continue
            stored = item.stored
            if stored is None or stored.dim() != 2 or stored.shape[0] != item.length:
                logger.warning("stored embedding of %s does not fit: encoding it", item.key)
                self.num_load_failures += 1
                self.encoded_instead.add(item.key)
                failed.append(item)
                continue
            self.embeddings[item.key] = to_device(stored, self.device)
            self._encoded_this_step.append(item.key)
            self.num_images_loaded += 1
        return failed

    def encode(self, items: list[MultiModalItem]) -> None:
        """Encode the items not held yet in one batched call, deduplicated by key."""
        todo: dict[str, MultiModalItem] = {}
        for item in items:
            if item.key not in self.embeddings:
                if item.by_handle:  # no pixels: only the scheduler losing it gets here
                    raise RuntimeError(
                        f"the embedding of media handle item {item.key} is missing and it has"
                        " no pixels to encode"
                    )
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
            if self.sink is not None:
                self.sink.encoded(key, emb)
        self.num_embeddings_computed += sum(item.length for item in todo.values())
        self.num_images_encoded += len(todo)

    def get_slice(self, item: MultiModalItem, start: int, end: int) -> torch.Tensor:
        """Embeddings of prompt positions [start, end) that lie inside ``item``."""
        emb = self.embeddings.get(item.key)
        if emb is None:
            logger.error("image %s missing at gather: encoding it again", item.key)
            self.num_gather_misses += 1
            self.encoded_instead.add(item.key)
            self.encode([item])
            emb = self.embeddings[item.key]
        return emb[start - item.offset : end - item.offset]
