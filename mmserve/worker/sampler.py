"""Token sampling: batched greedy, per-request seeded sampling with top-k / top-p / min_p,
the batched logits processors (``logits_processors``) and raw logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mmserve.sampling_params import SamplingParams, TokenLogprobs
from mmserve.worker.logits_processors import TokenHistory, apply_min_p, process_logits


@dataclass
class SamplerOutput:
    """One sampled token per row, and its logprobs where the row asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)


def compute_logprobs(
    logprobs: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]
) -> list[TokenLogprobs]:
    """logprobs: [R, vocab] log-softmax rows; the chosen token's value and rank, and the
    ``num_top[r]`` most likely tokens of row r, from one batched topk."""
    chosen = torch.tensor(list(token_ids), dtype=torch.long, device=logprobs.device)
    values = logprobs.gather(1, chosen.unsqueeze(1))
    ranks = (logprobs > values).sum(-1) + 1
    top_vals, top_ids = logprobs.topk(max(max(num_top, default=0), 1), dim=-1)
    out = []
    for r, (tok, val, rank) in enumerate(
        zip(token_ids, values[:, 0].tolist(), ranks.tolist(), strict=True)
    ):
        n = num_top[r]
        top = list(zip(top_ids[r, :n].tolist(), top_vals[r, :n].tolist(), strict=True))
        out.append(TokenLogprobs(int(tok), float(val), int(rank), top))
    return out


def _sample_row(scores: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    scores = scores / p.temperature
    if p.min_p > 0:
        scores = apply_min_p(scores, p.min_p)
    if p.top_k > 0 and p.top_k < scores.numel():
        kth = torch.topk(scores, p.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = sorted_scores.softmax(-1)
        # drop a token when the mass before it already reaches top_p (keeps at least one)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        scores[order[drop]] = float("-inf")
    return int(torch.multinomial(scores.softmax(-1), 1, generator=gen).item())


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: list[TokenHistory] | None = None,
    eos_token_ids: frozenset[int] = frozenset(),
) -> SamplerOutput:
    """logits: [R, vocab] float. ``histories`` (each row's tokens) is needed only when a row
    uses penalties or min_tokens; a batch with no such row and no logprobs pays nothing extra.
    Order as in vLLM: raw logprobs, min_tokens, logit_bias, penalties, greedy argmax; sampled
    rows then apply temperature, min_p, top-k, top-p."""
    raw = logits
    if any(p.needs_logits_processing for p in params):
        if histories is None:
            raise ValueError("penalties and min_tokens need the rows' token histories")
        logits = process_logits(logits, params, histories, eos_token_ids)
    out = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            out[row] = _sample_row(logits[row].float(), p, gen)
    wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not wanted:
        return SamplerOutput(out, [])
    logprobs: list[TokenLogprobs | None] = [None] * len(params)
    rows = raw[wanted].float().log_softmax(-1)
    nums = [params[i].logprobs or 0 for i in wanted]
    for i, lp in zip(wanted, compute_logprobs(rows, [out[i] for i in wanted], nums), strict=True):
        logprobs[i] = lp
    return SamplerOutput(out, logprobs)
