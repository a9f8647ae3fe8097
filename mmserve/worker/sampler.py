"""Token sampling: batched greedy, per-request seeded sampling with top-k / top-p."""

from __future__ import annotations

import torch

from mmserve.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """logits: [R, vocab] float; returns one token id per row."""
    out = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        scores = logits[row].float() / p.temperature
        if p.top_k > 0 and p.top_k < scores.numel():
            kth = torch.topk(scores, p.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            probs = sorted_scores.softmax(-1)
            # drop a token when the mass before it already reaches top_p (keeps at least one)
            drop = (probs.cumsum(-1) - probs) >= p.top_p
            scores[order[drop]] = float("-inf")
        probs = scores.softmax(-1)
        out[row] = int(torch.multinomial(probs, 1, generator=gen).item())
    return out
