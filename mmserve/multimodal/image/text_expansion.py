"""Prompts of families whose processor writes each image's text into the prompt (``ImageText``,
Gemma 3): the text goes in before tokenizing, and each run of image tokens becomes one item."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mmserve.inputs import MultiModalItem, ProcessedPrompt
from mmserve.multimodal.image.memo import PreparedImage
from mmserve.multimodal.image.prep import ImageText

Tokenize = Callable[[str | Sequence[int]], list[int]]
ItemKey = Callable[[int, PreparedImage], str]


class ImageTextExpander:
    """Expands an ``ImageText`` family's image markers and cuts the image token runs into items.

    A token-id prompt must hold each image's text already, or bare marker tokens that are
    expanded here as vLLM does for token prompts.
    """

    def __init__(
        self,
        image_text: ImageText,
        tokenizer: Any,
        tokenize: Tokenize,
        image_token_id: int | None,
    ) -> None:
        """``tokenize``: prompt -> token ids (checked against the vocabulary)."""
        self.image_text = image_text
        self.tokenizer = tokenizer
        self.tokenize = tokenize
        self.image_token_id = image_token_id

    def check_marker_count(self, prompt: str | Sequence[int], num_images: int) -> None:
        """ValueError unless a text prompt has one image marker per image."""
        if isinstance(prompt, str) and prompt.count(self.image_text.marker) != num_images:
            raise ValueError(
                f"prompt has {prompt.count(self.image_text.marker)} image placeholder(s) but"
                f" {num_images} image(s) were given"
            )

    def expand(
        self, prompt: str | Sequence[int], prepared: list[PreparedImage], key_of: ItemKey
    ) -> ProcessedPrompt:
        """Token ids with each image's text, and one item per run of image tokens: the image,
        then each pan-and-scan crop (keyed ``<image key>#<crop>``), in the processor's order.
        ``key_of(i, image)``: the item key of image ``i``."""
        groups = [_groups(p.data) for p in prepared]
        texts = [self.image_text.text(n) for n in groups]
        if isinstance(prompt, str):
            parts = prompt.split(self.image_text.marker)
            prompt = parts[0] + "".join(t + part for t, part in zip(texts, parts[1:], strict=True))
        ids = np.asarray(self.tokenize(prompt), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("prompt is empty")
        if not isinstance(prompt, str):
            ids = self._expand_marker_tokens(ids, texts)
        edges = np.diff(np.concatenate(([0], ids == self.image_token_id, [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if len(starts) != sum(groups):
            raise ValueError(
                f"prompt has {len(starts)} runs of image tokens, its {len(prepared)} image(s)"
                f" need {sum(groups)}"
            )
        items: list[MultiModalItem] = []
        for i, (image, n) in enumerate(zip(prepared, groups, strict=True)):
            key = key_of(i, image)
            rows = [image.data] if n == 1 else list(image.data)  # one group: the memo's object
            for crop, data in enumerate(rows):
                start, end = int(starts[len(items)]), int(ends[len(items)])
                if end - start != image.length // n:
                    raise ValueError(f"image {i} needs runs of {image.length // n} image tokens")
                if n == 1:
                    items.append(MultiModalItem(key, start, image.length, data))
                else:
                    part = MultiModalItem(
                        f"{key}#{crop}", start, image.length // n, data, crop=crop
                    )
                    items.append(part)
        return ProcessedPrompt(ids.tolist(), items)

    def _expand_marker_tokens(self, ids: np.ndarray, texts: list[str]) -> np.ndarray:
        """A token-id prompt: each marker token not followed by image tokens (not expanded
        yet) becomes its image's tokenized text."""
        marker = self.tokenizer.convert_tokens_to_ids(self.image_text.marker)
        following = np.append(ids[1:], -1)
        bare = np.flatnonzero((ids == marker) & (following != self.image_token_id))
        if not len(bare):
            return ids
        if len(bare) != len(texts):
            raise ValueError(
                f"prompt has {len(bare)} image placeholder(s) but {len(texts)} image(s) were given"
            )
        pieces = np.split(ids, bare)
        for i, text in enumerate(texts):
            encoded = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            pieces[i + 1] = np.concatenate((np.asarray(encoded, dtype=np.int64), pieces[i + 1][1:]))
        return np.concatenate(pieces)


def _groups(data: Any) -> int:
    """Embedding groups of an ``ImageText`` family's image data (see ``ImageText``)."""
    return len(data) if getattr(data, "ndim", 0) == 4 else 1
