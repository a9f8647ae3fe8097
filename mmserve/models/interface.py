"""The model contract: everything the engine, ``ModelRunner`` and ``EncoderRunner`` call.

A model family is one class satisfying ``VisionLanguageModel`` (most of it inherited from
``LlamaLMHeadMixin``), one line in ``models/registry.py`` and its processor glue in
``multimodal/image_prep.py``. Capabilities are declared attributes, never probed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from mmserve.inputs import MultiModalItem
    from mmserve.layers.attention import AttentionMetadata, PagedKVCache


class VisionLanguageModel(Protocol):
    """A VLM as mmserve runs it.

    - KV geometry (``num_layers``, ``num_kv_heads``, ``head_dim``) sizes the paged KV cache.
    - ``encode_images`` maps a batch of processor outputs (one per image) to one tensor of
      ``[num_embeddings, hidden_size]`` each; ``embed`` + ``__call__`` + ``compute_logits`` run the
      language model over the paged KV cache for a flat varlen batch.
    - A video is one item per temporal frame group (``MultiModalItem.video``), encoded by
      ``encode_images`` like an image; ``max_tokens_per_video_group`` bounds one group.
    - ``uses_mrope``: positions are ``[3, num_tokens]`` from ``mrope_positions`` (Qwen2-VL)
      instead of ``arange``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    uses_mrope: bool

    @staticmethod
    def max_tokens_per_image(
        hf_config: Any, processor_kwargs: dict[str, Any] | None = None
    ) -> int: ...

    @staticmethod
    def max_tokens_per_video_group(
        hf_config: Any, processor_kwargs: dict[str, Any] | None = None
    ) -> int:
        """0 for a model without video input."""

    def load_weights(self, checkpoint_dir: Path) -> None: ...

    def encode_images(self, images: list[Any]) -> list[torch.Tensor]: ...

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor: ...

    def __call__(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def mrope_positions(self, num_tokens: int, mm_items: Sequence[MultiModalItem]) -> Any:
        """Only called when ``uses_mrope``."""

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def eval(self) -> Any: ...
