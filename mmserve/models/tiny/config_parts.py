"""Hugging Face config pieces that several tiny preset families share."""

from __future__ import annotations

from typing import Any, Protocol

from .tokenizer import QWEN_SPECIAL_TOKEN_IDS


class HasDecoderSizes(Protocol):
    """The decoder sizes every preset spec names alike."""

    @property
    def text_hidden(self) -> int: ...
    @property
    def text_intermediate(self) -> int: ...
    @property
    def text_layers(self) -> int: ...
    @property
    def text_heads(self) -> int: ...
    @property
    def text_kv_heads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...


class HasVitSizes(Protocol):
    """The vision-tower sizes of the specs with a CLIP or SigLIP tower."""

    @property
    def image_size(self) -> int: ...
    @property
    def patch_size(self) -> int: ...
    @property
    def vision_hidden(self) -> int: ...
    @property
    def vision_intermediate(self) -> int: ...
    @property
    def vision_layers(self) -> int: ...
    @property
    def vision_heads(self) -> int: ...


def decoder_sizes(spec: HasDecoderSizes) -> dict[str, Any]:
    """``spec``'s decoder sizes under the names every HF text config uses."""
    return dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
    )


def siglip_vision_config(spec: HasVitSizes) -> dict[str, Any]:
    """The SigLIP vision tower (no pooling head) of LLaVA-OneVision and Gemma 3."""
    return dict(
        model_type="siglip_vision_model",
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        num_channels=3,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        vision_use_head=False,
    )


def chatml_generation_ids() -> dict[str, Any]:
    """bos/eos/pad of a ChatML (Qwen tokenizer) checkpoint: no bos, eos = ``<|im_end|>``, the
    turn end."""
    return {
        "bos_token_id": None,
        "eos_token_id": QWEN_SPECIAL_TOKEN_IDS["<|im_end|>"],
        "pad_token_id": QWEN_SPECIAL_TOKEN_IDS["<|endoftext|>"],
    }


def qwen2_text_config(spec: HasDecoderSizes, rope: dict[str, Any]) -> dict[str, Any]:
    """The Qwen2 decoder of LLaVA-OneVision and Qwen2-VL, with rope theta 1e6 plus ``rope``."""
    return dict(
        **decoder_sizes(spec),
        hidden_act="silu",
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, **rope},
        **chatml_generation_ids(),
    )


def crop_pinpoints(crop: int, grids: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Anyres pinpoints, (height, width) in pixels, of grids given in crops of ``crop`` pixels."""
    return tuple((rows * crop, cols * crop) for rows, cols in grids)


def pinpoint_lists(pinpoints: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """Pinpoints as HF configs store them."""
    return [list(p) for p in pinpoints]
