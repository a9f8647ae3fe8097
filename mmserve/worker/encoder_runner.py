"""Worker-side encoder cache: encodes scheduled images once and serves embedding slices."""

from __future__ import annotations

import logging
import time

import torch

from mmserve.core.outputs import MultiModalItem

logger = logging.getLogger(__name__)


class EncoderRunner:
    """Holds image embeddings by content hash, mirroring the scheduler's EncoderCacheManager.

    Invariants: an entry's first dimension equals the placeholder length of every item with its
    hash; entries are dropped only when the scheduler reports them evicted.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.embeddings: dict[str, torch.Tensor] = {}
        self.encoder_seconds = 0.0
        self.num_images_encoded = 0
        self.num_embeddings_computed = 0

    def drop(self, hashes: list[str]) -> None:
        for mm_hash in hashes:
            self.embeddings.pop(mm_hash, None)

    def encode(self, items: list[MultiModalItem]) -> None:
        """Encode the items not held yet in one batched call, deduplicated by hash."""
        todo: dict[str, MultiModalItem] = {}
        for item in items:
            if item.hash not in self.embeddings:
                todo.setdefault(item.hash, item)
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
            self.embeddings[item.hash] = emb
            self.num_embeddings_computed += item.length
        self.num_images_encoded += len(todo)

    def get_slice(self, item: MultiModalItem, start: int, end: int) -> torch.Tensor:
        """Embeddings of prompt positions [start, end) that lie inside ``item``."""
        emb = self.embeddings.get(item.hash)
        if emb is None:
            logger.error("image %s missing at gather: encoding it again", item.hash)
            self.encode([item])
            emb = self.embeddings[item.hash]
        if emb.shape[0] != item.length:
            raise RuntimeError(
                f"cached embeddings of image {item.hash} have {emb.shape[0]} rows, placeholder"
                f" needs {item.length}"
            )
        return emb[start - item.offset : end - item.offset]
