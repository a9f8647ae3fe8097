"""SmolVLM / SmolVLM2 (the Idefics3 architecture): image tiles, the image's prompt text, and
one encoder-cache item per image spanning that text.

The image processor (``Idefics3ImageProcessor``, SmolVLM2's ``SmolVLMImageProcessor`` alike)
resizes an image so its longest edge is ``size["longest_edge"]``, then, with
``do_image_splitting``, to whole multiples of the tile side (``max_image_size``) and cuts it
into ``rows x cols`` tiles, followed by the whole image shrunk to one tile ("global image");
without splitting the image is one tile and rows = cols = 0. Each tile gives
``image_seq_len`` embeddings. The processor writes the image's text in place of its
``<image>`` marker (``tile_text``: ``Idefics3Processor.replace_image_token``)::

    <fake_token_around_image><row_1_col_1><image>*L<fake_token_around_image><row_1_col_2>...\\n
    ...\\n
    \\n<fake_token_around_image><global-img><image>*L<fake_token_around_image>

Invariant kept here: an image is ONE ``MultiModalItem`` whose range is its whole text, from
the first ``<fake_token_around_image>`` to the last, its data carrying the text's token ids
(``span_ids``). The model's encoder output has one row per position of that range: the tile
embeddings at the ``<image>`` positions, the text embeddings of the tags and newlines between
them elsewhere. So every tile and the global image share one cache entry (keyed by the image
content and processor settings), and the ids of a span are always the canonical tokenization
of its text (a token-id prompt holding another is refused), so one key never has two spans.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mmserve.inputs import MultiModalItem, ProcessedPrompt, VideoGroup
from mmserve.multimodal.image.memo import PreparedImage

IDEFICS3_ARCHITECTURES = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
FAKE, IMAGE, GLOBAL = "<fake_token_around_image>", "<image>", "<global-img>"
VIDEO = "<video>"


@dataclass(frozen=True)
class SpannedText:
    """One input as the processor writes it into the prompt (``text``, in place of its
    ``marker``) and the one encoder item over its ``span_text``: from its first
    ``<fake_token_around_image>`` to its last, so its tokenization never depends on the text
    around it. An image's span is its whole text; a video's (SmolVLM2) every frame and the
    timestamps between them."""

    marker: str
    text: str
    span_text: str
    key: str
    data: dict[str, Any]
    video: VideoGroup | None = None
    label: str = "an input's text"


Tokenize = Callable[[str | Sequence[int]], list[int]]
ItemKey = Callable[[int, PreparedImage], str]


def image_seq_len(hf_config: Any) -> int:
    """Embeddings per tile: the tower's patches after the connector's pixel shuffle."""
    vision = hf_config.vision_config
    return (vision.image_size // vision.patch_size) ** 2 // hf_config.scale_factor**2


def load_tile_processor(path: str | Path, processor_kwargs: dict[str, Any] | None = None) -> Any:
    """The checkpoint's image processor (the PIL flavour of the class its
    ``preprocessor_config.json`` names: Idefics3's or SmolVLM's) with ``processor_kwargs``
    applied, or Idefics3's defaults where the checkpoint has none."""
    import transformers

    kwargs = dict(processor_kwargs or {})
    config = Path(path) / "preprocessor_config.json" if str(path) else None
    if config is None or not config.is_file():
        return transformers.Idefics3ImageProcessorPil(**kwargs)
    name = json.loads(config.read_text()).get("image_processor_type", "")
    base = name.removesuffix("Fast").removesuffix("Pil")
    cls = getattr(transformers, base + "Pil", transformers.Idefics3ImageProcessorPil)
    return cls.from_pretrained(path, **kwargs)


def max_span_tokens(hf_config: Any, processor_kwargs: dict[str, Any] | None = None) -> int:
    """An upper bound of an image's text length in tokens, at most ``n x n`` tiles with ``n =
    ceil(longest_edge / max_image_size)``: each tile ``L + 2`` tokens, a newline per row, two
    more before the global image and its ``L + 3`` (attained where the tokenizer does not merge
    ``\\n\\n``, one less where it does)."""
    path = getattr(hf_config, "_name_or_path", "") or ""
    proc = load_tile_processor(path, processor_kwargs)
    seq = image_seq_len(hf_config)
    tile = int(proc.max_image_size["longest_edge"])
    if tile != hf_config.vision_config.image_size:
        raise ValueError(
            f"the image processor's max_image_size ({tile}) must be the vision tower's"
            f" image_size ({hf_config.vision_config.image_size})"
        )
    if not proc.do_image_splitting:
        return seq + 3
    if not proc.do_resize:
        raise ValueError("SmolVLM images need do_resize (the tile count is unbounded without)")
    n = math.ceil(int(proc.size["longest_edge"]) / tile)
    if n > 6:
        raise ValueError(f"{n} tiles a side; the tokenizer has tile tags up to <row_6_col_6>")
    return n * (n * (seq + 2) + 1) + 1 + seq + 3


def hf_tiles(image_processor: Any, image: Image.Image) -> dict[str, Any]:
    """``{"pixel_values": [tiles + 1, 3, S, S] (global image last; [1, 3, S, S] unsplit),
    "rows", "cols"}`` from the checkpoint's image processor."""
    out = image_processor(images=image, return_tensors="np", return_row_col_info=True)
    return {
        "pixel_values": out["pixel_values"][0],
        "rows": int(out["rows"][0][0]),
        "cols": int(out["cols"][0][0]),
    }


def tile_inputs(processed: Any, image_processor: Any, model_config: Any) -> tuple[Any, int]:
    """The image data and its embedding count (every tile's, the global image's); the item's
    length is that of its text (``TiledImageExpander``)."""
    rows, cols = processed["rows"], processed["cols"]
    frames = rows * cols + 1
    if len(processed["pixel_values"]) != frames:
        raise ValueError(f"{len(processed['pixel_values'])} tiles for a {rows}x{cols} grid")
    return processed, frames * image_seq_len(model_config.hf_config)


def tile_text(rows: int, cols: int, seq_len: int) -> str:
    """``Idefics3Processor.replace_image_token``: the text of an image of ``rows x cols``
    tiles (0 x 0: not split)."""
    tiles = IMAGE * seq_len
    whole = f"{FAKE}{GLOBAL}{tiles}{FAKE}"
    if rows == 0 and cols == 0:
        return whole
    grid = "".join(
        "".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{tiles}" for c in range(cols)) + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{whole}"


class TiledImageExpander:
    """Writes each image's text into the prompt and makes it one item (see the module
    docstring). Text prompts hold one ``<image>`` marker per image; token-id prompts hold
    either bare ``<image>`` marker tokens or every image's text already (canonically
    tokenized)."""

    def __init__(
        self, tokenizer: Any, tokenize: Tokenize, model_config: Any, video_markers: bool = False
    ) -> None:
        """``tokenize``: prompt -> token ids (checked against the vocabulary);
        ``video_markers``: whether ``<video>`` in a text prompt marks a video (SmolVLM2)."""
        self.video_markers = video_markers
        self.tokenizer = tokenizer
        self.tokenize = tokenize
        self.seq_len = image_seq_len(model_config.hf_config)
        self.image_token_id = int(model_config.image_token_id)
        self.fake_token_id = int(tokenizer.convert_tokens_to_ids(FAKE))
        self._spans: dict[tuple[int, int], np.ndarray] = {}

    def check_marker_count(self, prompt: str | Sequence[int], num_images: int) -> None:
        """ValueError unless a text prompt has one ``<image>`` marker per image."""
        if isinstance(prompt, str) and prompt.count(IMAGE) != num_images:
            raise ValueError(
                f"prompt has {prompt.count(IMAGE)} image placeholder(s) but {num_images}"
                " image(s) were given"
            )

    def span_ids(self, rows: int, cols: int) -> np.ndarray:
        """The canonical token ids of the text of a ``rows x cols`` image (memoized)."""
        key = (rows, cols)
        if key not in self._spans:
            text = tile_text(rows, cols, self.seq_len)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._spans[key] = np.asarray(ids, dtype=np.int64)
        return self._spans[key]

    def expand(
        self,
        prompt: str | Sequence[int],
        prepared: list[PreparedImage],
        key_of: ItemKey,
        videos: Sequence[SpannedText] = (),
    ) -> ProcessedPrompt:
        """Token ids with each image's (and video's) text and one item per input over it, in
        prompt order. ``key_of(i, image)``: the item key of image ``i``; ``videos``: each
        video's text and item (SmolVLM2), written in place of its ``<video>`` marker."""
        images = [self._image_text(i, p, key_of(i, p)) for i, p in enumerate(prepared)]
        spans = {id(t): self._span(t) for t in [*images, *videos]}
        order: list[SpannedText] | None = None
        if isinstance(prompt, str):
            prompt, order = self._written(prompt, images, list(videos))
        ids = np.asarray(self.tokenize(prompt), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("prompt is empty")
        if not isinstance(prompt, str) and prepared and not (ids == self.fake_token_id).any():
            if videos:
                raise ValueError(
                    "a token-id prompt with a video must hold the video's text as the"
                    " processor writes it"
                )
            ids = self._expand_marker_tokens(ids, [spans[id(t)] for t in images])
        wanted = sum(int((span == self.image_token_id).sum()) for span in spans.values())
        if int((ids == self.image_token_id).sum()) != wanted:
            raise ValueError(
                f"prompt has {int((ids == self.image_token_id).sum())} image tokens, its"
                f" {len(prepared)} image(s) and {len(videos)} video(s) need {wanted}"
            )
        items: list[MultiModalItem] = []
        cursor = 0
        starts = np.flatnonzero(ids == self.fake_token_id)
        pending = [list(videos), images]  # a token-id prompt: the next video, else image
        for step in range(len(spans)):
            later = starts[starts >= cursor]
            start = int(later[0]) if len(later) else len(ids)
            options = [order[step]] if order is not None else [q[0] for q in pending if q]
            found = [
                t
                for t in options
                if np.array_equal(ids[start : start + len(spans[id(t)])], spans[id(t)])
            ]
            if not found:
                raise ValueError(
                    f"{options[-1].label} is not in the prompt as its processor writes it"
                )
            text = found[0]
            for queue in pending:
                if queue and queue[0] is text:
                    queue.pop(0)
            span = spans[id(text)]
            data = {**text.data, "span_ids": span}
            items.append(MultiModalItem(text.key, start, len(span), data, text.video))
            cursor = start + len(span)
        return ProcessedPrompt(ids.tolist(), items)

    def _image_text(self, i: int, image: PreparedImage, key: str) -> SpannedText:
        rows, cols = image.data["rows"], image.data["cols"]
        text = tile_text(rows, cols, self.seq_len)
        label = f"image {i}'s text ({rows}x{cols} tiles)"
        return SpannedText(IMAGE, text, text, key, image.data, label=label)

    def _span(self, text: SpannedText) -> np.ndarray:
        """The canonical token ids of the part of ``text`` its item spans."""
        if text.marker == IMAGE:
            return self.span_ids(text.data["rows"], text.data["cols"])
        ids = self.tokenizer(text.span_text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def _written(
        self, prompt: str, images: list[SpannedText], videos: list[SpannedText]
    ) -> tuple[str, list[SpannedText]]:
        """A text prompt with each marker replaced by its input's text, and the inputs in
        prompt order (``<video>`` is a marker only for a model given videos)."""
        if prompt.count(VIDEO) != len(videos) and (videos or self.video_markers):
            raise ValueError(
                f"prompt has {prompt.count(VIDEO)} video placeholder(s) but {len(videos)}"
                " video(s) were given"
            )
        markers = f"({re.escape(IMAGE)}|{re.escape(VIDEO)})" if videos else f"({re.escape(IMAGE)})"
        parts = re.split(markers, prompt)
        queues = {IMAGE: iter(images), VIDEO: iter(videos)}
        order = [next(queues[marker]) for marker in parts[1::2]]
        texts = [t.text for t in order]
        return parts[0] + "".join(t + p for t, p in zip(texts, parts[2::2], strict=True)), order

    def _expand_marker_tokens(self, ids: np.ndarray, spans: list[np.ndarray]) -> np.ndarray:
        """A token-id prompt with bare ``<image>`` marker tokens: each becomes its image's
        canonical text."""
        bare = np.flatnonzero(ids == self.image_token_id)
        if len(bare) != len(spans):
            raise ValueError(
                f"prompt has {len(bare)} image placeholder(s) but {len(spans)} image(s) were given"
            )
        pieces = np.split(ids, bare)
        for i, span in enumerate(spans):
            pieces[i + 1] = np.concatenate((span, pieces[i + 1][1:]))
        return np.concatenate(pieces)
