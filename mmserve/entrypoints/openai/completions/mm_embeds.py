"""``image_embeds`` content parts over HTTP, vLLM's request shape behind its
``--enable-mm-embeds`` flag.

A part is ``{"type": "image_embeds", "image_embeds": B64}`` or, for Qwen-VL, ``{"type":
"image_embeds", "image_embeds": {"image_embeds": B64, "image_grid_thw": B64 | [1, h, w]}}``,
where ``B64`` is the base64 of a ``torch.save``d tensor. Without the flag such a part is a 400
(``mm_embeds_disabled``). With it, each value is decoded in this order, in the text pool: its
base64 length is capped by the media policy's ``max_data_url_bytes`` (413 above, before
anything is decoded); the base64 must be strict; ``torch.load`` runs with ``weights_only`` and
with sparse-tensor invariants checked; the result must be a dense floating ``(tokens, width)``
tensor of at most the model's largest image's rows (``admission.embeds.check_embeds_shape``,
which reads only metadata). The tensors then go to the offline path (``ImageEmbeds``), whose
admission checks the exact row count, the grid and finiteness, and keys them by content.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from dataclasses import dataclass
from typing import Any

import torch

from mmserve.engine.admission.embeds import check_embeds_shape, max_embeds_rows
from mmserve.engine.front.async_engine import AsyncLLMEngine
from mmserve.entrypoints.openai.http.errors import APIError
from mmserve.multimodal.media.errors import too_large

logger = logging.getLogger(__name__)
DISABLED = "mm_embeds_disabled"


def _where(field: str, i: int, j: int) -> str:
    return f"content[{j}]" if field == "content" else f"{field}[{i}].content[{j}]"


def has_embeds(messages: list[dict[str, Any]]) -> bool:
    """Whether any message has an ``image_embeds`` part."""
    return any(
        isinstance(part, dict) and part.get("type") == "image_embeds"
        for msg in messages
        if isinstance(msg.get("content"), list)
        for part in msg["content"]
    )


def refuse_embeds(field: str) -> APIError:
    """The 400 for an ``image_embeds`` part sent to a server without the flag."""
    return APIError(
        400,
        f"{field}: image_embeds parts are not accepted by this server; start it with"
        " --enable-mm-embeds to accept them (or send the image)",
        param=field,
        code=DISABLED,
    )


@dataclass(frozen=True)
class EmbedsDecoder:
    """Decodes the serialized tensors of ``image_embeds`` parts for one model."""

    max_bytes: int  # the media policy's max_data_url_bytes
    width: int  # the model's embedding width
    max_rows: int  # the most rows one image's embeddings have in this model

    @classmethod
    def of(cls, engine: AsyncLLMEngine) -> EmbedsDecoder:
        """The decoder of ``engine``'s model and media policy."""
        processor = engine.engine.processor
        mc = processor.model_config
        width = mc.embedding_width or mc.hidden_size
        return cls(engine.fetcher.policy.max_data_url_bytes, width, max_embeds_rows(processor))

    def decode(self, messages: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
        """``messages`` with each ``image_embeds`` part's values decoded (new dicts; the
        given ones are left as they are). ``field`` names the messages in errors."""
        out = []
        for i, msg in enumerate(messages):
            content = msg.get("content")
            if isinstance(content, list):
                content = [
                    self._part(part, _where(field, i, j))
                    if isinstance(part, dict) and part.get("type") == "image_embeds"
                    else part
                    for j, part in enumerate(content)
                ]
                msg = {**msg, "content": content}
            out.append(msg)
        return out

    def _part(self, part: dict[str, Any], where: str) -> dict[str, Any]:
        value = part.get("image_embeds")
        if not isinstance(value, dict):
            return {**part, "image_embeds": self._embeds(value, f"{where}.image_embeds")}
        decoded = dict(value)
        decoded["image_embeds"] = self._embeds(value.get("image_embeds"), f"{where}.image_embeds")
        grid = value.get("image_grid_thw")
        if isinstance(grid, str):
            decoded["image_grid_thw"] = self._load(grid, f"{where}.image_grid_thw")
        return {**part, "image_embeds": decoded}

    def _embeds(self, value: Any, where: str) -> torch.Tensor:
        tensor = self._load(value, where)
        try:
            check_embeds_shape(tensor, self.width, self.max_rows)  # before anything reads it
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        return tensor

    def _load(self, value: Any, where: str) -> torch.Tensor:
        """A base64 ``torch.save``d tensor -> the tensor, loaded ``weights_only``."""
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a base64 string of a torch.save'd tensor")
        if len(value) > 4 * -(-self.max_bytes // 3):  # before decoding anything
            raise too_large("image", f"embeddings at {where} exceed {self.max_bytes} bytes")
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where} is not valid base64") from None
        try:
            with torch.sparse.check_sparse_tensor_invariants():
                loaded = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
        except Exception as exc:  # any failure to load is the client's: never shown as is
            logger.info("torch.load refused %s: %s: %.300s", where, type(exc).__name__, exc)
            raise ValueError(
                f"{where} is not a tensor that torch.load(weights_only=True) accepts"
            ) from None
        if not isinstance(loaded, torch.Tensor):
            raise ValueError(f"{where} must be a torch.Tensor, got {type(loaded).__name__}")
        return loaded
