"""The model contract: everything the engine, ``ModelRunner`` and ``EncoderRunner`` call.

A model family is one class satisfying ``VisionLanguageModel`` (most of it inherited from
``LlamaLMHeadMixin``), one line in ``models/registry.py`` and its processor glue in
``multimodal/image_prep.py``. Capabilities are declared attributes, never probed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

if TYPE_CHECKING:
    from mmserve.inputs import MultiModalItem
    from mmserve.layers.attention import AttentionMetadata, PagedKVCache


class DeepstackInputs(NamedTuple):
    """The DeepStack features of the image tokens of one flat batch.

    ``rows``: flat batch indices of the image tokens; ``features``: their rows of the encoder
    output past the first ``hidden_size`` columns, ``[len(rows), hidden_size * k]`` (feature
    ``i`` is added after decoder layer ``i``).
    """

    rows: torch.Tensor
    features: torch.Tensor


class VisionLanguageModel(Protocol):
    """A VLM as mmserve runs it.

    - KV geometry (``num_layers``, ``num_kv_heads``, ``head_dim``) sizes the paged KV cache.
    - ``encode_images`` maps a batch of processor outputs (one per image) to one tensor of
      ``[num_embeddings, embedding_width(hf_config)]`` each (``hidden_size`` wide unless the
      model has DeepStack layers); ``embed`` + ``__call__`` + ``compute_logits`` run the
      language model over the paged KV cache for a flat varlen batch.
    - A video is one item per temporal frame group (``MultiModalItem.video``; LLaVA-OneVision:
      per frame), encoded by ``encode_images`` like an image; ``max_tokens_per_video_group``
      bounds one group.
    - ``uses_mrope``: positions are ``[3, num_tokens]`` from ``mrope_positions`` (Qwen2-VL)
      instead of ``arange``.
    - ``deepstack_layers`` (k > 0: Qwen3-VL): each image embedding row is
      ``embedding_width(hf_config)`` = ``hidden_size * (1 + k)`` wide, the main embedding then
      k DeepStack features. The encoder cache holds (and budgets) the wide rows; the runner
      splices the first ``hidden_size`` columns into the input embeddings and passes the rest,
      with their flat rows, as ``DeepstackInputs`` to ``__call__``. Models with k = 0 get None.
    - ``image_attention``: ``"causal"``, or ``"bidirectional"`` (Gemma 3: an image's tokens
      see each other; the engine then never splits an image across prefill chunks and passes
      the image ranges to attention).
    - ``attention_masks``: None, or what the model's attention needs beyond a causal mask
      (sliding windows, image ranges): such a model runs the torch path.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    uses_mrope: bool
    deepstack_layers: int

    @staticmethod
    def embedding_width(hf_config: Any) -> int: ...

    image_attention: str
    attention_masks: str | None

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
        deepstack: DeepstackInputs | None = None,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def mrope_positions(self, num_tokens: int, mm_items: Sequence[MultiModalItem]) -> Any:
        """Only called when ``uses_mrope``."""

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def eval(self) -> Any: ...
