"""Tokenizers with the published length and special-token ids of a real checkpoint.

The real vocabularies cannot be downloaded here, so a small byte-level BPE is trained on the
built-in corpus (``TRAINED_SIZE`` tokens, as the tiny presets do) and laid out over the
published id range: the special tokens at their published ids, the trained tokens in the
lowest other ids, and never-produced fillers (``<unusedN>``) in the rest. Token *ids* that
configs and templates rely on (image placeholders, eos, ``<|im_start|>``...) are therefore the
published ones; how text splits into ordinary tokens is not.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ..tokenizer import TokenizerFlavor, train_bpe
from .spec import TokenLayout

TRAINED_SIZE = 4096
PLAIN = TokenizerFlavor((), "", eos="", pad="")  # no specials: they are placed afterwards


@cache
def _trained() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The trained BPE's tokens in id order and its merges."""
    model: dict[str, Any] = json.loads(train_bpe(TRAINED_SIZE, flavor=PLAIN).to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = tuple(
        tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in model["merges"]
    )
    return tuple(sorted(vocab, key=vocab.__getitem__)), merges  # type: ignore[return-value]


def layout_vocab(layout: TokenLayout) -> dict[str, int]:
    """Token -> id over ``range(layout.size)``: specials at their ids, then trained tokens,
    then fillers."""
    tokens, _ = _trained()
    by_id = {i: tok for tok, i in layout.specials.items()}
    if len(by_id) != len(layout.specials) or max(by_id) >= layout.size:
        raise ValueError(f"special ids must be distinct and below {layout.size}")
    trained = iter(tokens)
    vocab: dict[str, int] = {}
    for i in range(layout.size):
        token = by_id.get(i) or next(trained, None) or f"<unused{i}>"
        vocab[token] = i
    if len(vocab) != layout.size:
        raise ValueError("a special token collides with a trained or filler token")
    return vocab


def build_shape_tokenizer(layout: TokenLayout) -> PreTrainedTokenizerFast:
    """A fast tokenizer of exactly ``layout.size`` tokens with ``layout``'s specials."""
    _, merges = _trained()
    tok = Tokenizer(
        models.BPE(vocab=layout_vocab(layout), merges=list(merges), unk_token=layout.unk)
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    by_id = sorted(layout.specials, key=layout.specials.__getitem__)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in by_id])
    if layout.bos is not None:
        bos, bos_id = layout.bos, layout.specials[layout.bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=layout.bos,
        eos_token=layout.eos,
        unk_token=layout.unk,
        pad_token=layout.pad,
        model_max_length=layout.model_max_length,
        extra_special_tokens=dict(layout.extra_special_tokens) or None,
    )
