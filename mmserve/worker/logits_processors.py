"""Batched logits processing with vLLM's semantics: min_tokens, logit_bias, penalties, min_p.

Every function takes the [R, vocab] float logits of the rows that need it and edits them in
place with whole-batch tensor ops (gathers / index_put over (row, token) pairs, no per-token
Python loops).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from mmserve.sampling_params import SamplingParams


@dataclass
class TokenHistory:
    """The tokens a request has so far (prompt then output) and how many are prompt."""

    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def _row_scatter_index(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(row, token) index tensors of every token of every sequence, for index_put_."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(seqs)), lengths).to(device)
    tokens = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.long)
    return rows, tokens.to(device)


def apply_min_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[TokenHistory],
    eos_token_ids: frozenset[int],
) -> None:
    """Mask EOS (unless ignore_eos) and stop_token_ids while a row is below min_tokens, except
    in a row where they are all that is left (a grammar that is complete allows only EOS: it
    ends the request rather than every token being masked)."""
    banned = []
    for p, hist in zip(params, histories, strict=True):
        stops: list[int] = []
        if p.min_tokens and hist.num_output_tokens < p.min_tokens:
            stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
        banned.append(stops)
    if any(banned):
        rows, tokens = _row_scatter_index(banned, logits.device)
        allowed = torch.isfinite(logits)
        allowed[rows, tokens] = False
        keep = allowed.any(-1)[rows]
        logits.index_put_(
            (rows[keep], tokens[keep]), torch.tensor(float("-inf"), device=logits.device)
        )


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """Add each row's ``logit_bias`` (token id -> bias) in one accumulate index_put."""
    items = [list(p.logit_bias.items()) for p in params]
    if not any(items):
        return
    rows, _ = _row_scatter_index([[t for t, _ in row] for row in items], logits.device)
    tokens = torch.tensor([t for row in items for t, _ in row], dtype=torch.long)
    biases = torch.tensor([b for row in items for _, b in row], dtype=logits.dtype)
    logits.index_put_((rows, tokens.to(logits.device)), biases.to(logits.device), accumulate=True)


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], histories: list[TokenHistory]
) -> None:
    """repetition_penalty over prompt + output tokens, presence / frequency over output.

    Works on the (row, token) pairs of the histories, O(tokens) rather than O(rows x vocab):
    a plain put of a value computed from the pre-update logits is idempotent for repeated
    pairs, and the frequency term accumulates once per occurrence."""
    device, dtype = logits.device, logits.dtype
    rep = torch.tensor([p.repetition_penalty for p in params], dtype=dtype, device=device)
    if bool((rep != 1).any()):
        rows, tokens = _row_scatter_index([h.token_ids for h in histories], device)
        seen, factor = logits[rows, tokens], rep[rows]
        logits[rows, tokens] = torch.where(seen > 0, seen / factor, seen * factor)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=dtype, device=device)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=dtype, device=device)
    if bool((freq != 0).any() or (pres != 0).any()):
        outputs = [h.token_ids[h.num_prompt_tokens :] for h in histories]
        rows, tokens = _row_scatter_index(outputs, device)
        logits.index_put_((rows, tokens), -freq[rows], accumulate=True)
        logits[rows, tokens] = logits[rows, tokens] - pres[rows]


def apply_min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` x the top token's (one row or many)."""
    probs = scores.softmax(-1)
    threshold = probs.amax(-1, keepdim=True) * min_p
    return scores.masked_fill(probs < threshold, float("-inf"))


def process_logits(
    logits: torch.Tensor,
    params: list[SamplingParams],
    histories: list[TokenHistory],
    eos_token_ids: frozenset[int],
) -> torch.Tensor:
    """The greedy-affecting processors in vLLM's order: min_tokens, logit_bias, penalties.
    Returns new float32 logits; rows that need none of them are left as they were."""
    rows = [i for i, p in enumerate(params) if p.needs_logits_processing]
    out = logits.float().clone()
    if not rows:
        return out
    sub = out[rows]
    sub_params = [params[i] for i in rows]
    sub_hist = [histories[i] for i in rows]
    apply_min_tokens(sub, sub_params, sub_hist, eos_token_ids)
    apply_logit_bias(sub, sub_params)
    if any(p.uses_penalties for p in sub_params):
        apply_penalties(sub, sub_params, sub_hist)
    out[rows] = sub
    return out
