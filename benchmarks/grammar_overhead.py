"""Per-token CPU overhead of a grammar constraint: xgrammar vs outlines-core.

For each library: compile a JSON schema against a tokenizer, then walk a fixed valid output
token by token doing what the sampler does per step (fill the row's token mask, apply it to a
[1, vocab] logits row, advance the matcher with the token). Reports compile time and the
median (min-max) per-token cost over interleaved rounds.

Run under the shared lock:
    flock /tmp/mmserve-timing.lock python benchmarks/grammar_overhead.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
    },
    "required": ["name", "age", "tags", "city"],
    "additionalProperties": False,
}
OUTPUT = '{"name": "a small grey cat", "age": 42, "tags": ["red", "blue", "x"], "city": "Rome"}'


def _xgrammar(tokenizer: Any, vocab: int, eos: int) -> tuple[float, Callable[[list[int]], None]]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=True, max_whitespace_cnt=2
    )
    compile_s = time.perf_counter() - t0
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def walk(tokens: list[int]) -> None:
        matcher = xgr.GrammarMatcher(compiled)
        logits = torch.zeros(1, vocab)
        for tok in tokens:
            matcher.fill_next_token_bitmask(bitmask, 0)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            assert matcher.accept_token(tok), tok

    return compile_s, walk


def _outlines(tokenizer: Any, vocab: int, eos: int) -> tuple[float, Callable[[list[int]], None]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    for token, idx in tokenizer.get_vocab().items():
        if idx == eos or idx in tokenizer.all_special_ids:
            continue
        text = tokenizer.convert_tokens_to_string([token])
        pieces.setdefault(text, []).append(idx)
    index = Index(build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?"), Vocabulary(eos, pieces))
    compile_s = time.perf_counter() - t0
    words = (vocab + 31) // 32
    mask = torch.zeros(1, words, dtype=torch.int32)
    bits = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)

    def walk(tokens: list[int]) -> None:
        guide = Guide(index)
        logits = torch.zeros(1, vocab)
        for tok in tokens:
            guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
            allowed = ((mask.to(torch.int64).unsqueeze(-1) & bits) != 0).flatten(1)[:, :vocab]
            logits.masked_fill_(~allowed, float("-inf"))
            guide.advance(tok)

    return compile_s, walk


def _synthetic_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE of ``vocab_size`` trained on random words (no hub download): a stand-in
    for a real model's vocabulary size, which is what the mask work scales with."""
    import random

    from transformers import PreTrainedTokenizerFast

    from mmserve.models.tiny.tokenizer import QWEN2_VL, train_bpe

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:{}[]\"'"
    corpus = [
        " ".join("".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(50))
        for _ in range(vocab_size // 2)
    ]
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(vocab_size, corpus, QWEN2_VL),
        eos_token=QWEN2_VL.eos,
        pad_token=QWEN2_VL.pad,
    )


def main(rounds: int = 7) -> None:
    from transformers import AutoTokenizer

    from mmserve.models.tiny import resolve_model_path

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for preset in os.environ.get(
        "PRESETS", "tiny-qwen2-vl,tiny-llava-small,bpe-32000,bpe-100000"
    ).split(","):
        if preset.startswith("bpe-"):
            tokenizer = _synthetic_tokenizer(int(preset[4:]))
        else:
            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(preset))
        vocab, eos = len(tokenizer), tokenizer.eos_token_id
        tokens = tokenizer.encode(OUTPUT, add_special_tokens=False)
        libs = {"xgrammar": _xgrammar, "outlines-core": _outlines}
        walks = {}
        for name, build in libs.items():
            compile_s, walk = build(tokenizer, vocab, eos)
            walks[name] = walk
            results[f"{preset}/{name}/compile_ms"] = round(compile_s * 1e3, 1)
        per_token: dict[str, list[float]] = {name: [] for name in libs}
        for _ in range(rounds):  # interleaved A/B rounds
            for name, walk in walks.items():
                t0 = time.perf_counter()
                walk(tokens)
                per_token[name].append((time.perf_counter() - t0) / len(tokens) * 1e6)
        for name, samples in per_token.items():
            results[f"{preset}/{name}/us_per_token"] = (
                f"{statistics.median(samples):.1f} ({min(samples):.1f}-{max(samples):.1f})"
            )
        results[f"{preset}/vocab"] = vocab
        results[f"{preset}/tokens"] = len(tokens)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
