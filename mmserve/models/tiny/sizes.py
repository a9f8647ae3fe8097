"""The sizes the presets of every family share: one set for the CI presets, one for the
benchmark ("-small") presets. The spec classes inherit these fields; a preset spreads a set
into its spec (``**asdict(CI_TEXT)``) where its family uses it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextSizes:
    """Of the language model."""

    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    vocab_size: int
    max_position_embeddings: int


@dataclass(frozen=True)
class VitSizes:
    """Of a CLIP or SigLIP tower."""

    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int


CI_TEXT = TextSizes(
    text_hidden=128,
    text_intermediate=256,
    text_layers=2,
    text_heads=4,
    text_kv_heads=2,
    vocab_size=2048,
    max_position_embeddings=4096,
)
BENCH_TEXT = TextSizes(
    text_hidden=512,
    text_intermediate=896,
    text_layers=4,
    text_heads=8,
    text_kv_heads=4,
    vocab_size=4096,
    max_position_embeddings=8192,
)
CI_VIT = VitSizes(vision_hidden=32, vision_layers=2, vision_heads=2, vision_intermediate=64)
BENCH_VIT = VitSizes(vision_hidden=192, vision_layers=4, vision_heads=4, vision_intermediate=768)
