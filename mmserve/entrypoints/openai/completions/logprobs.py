"""OpenAI's logprobs shapes, from the engine's ``TokenLogprobs``.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``. Completions:
``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``, whose
top-logprobs dict holds the sampled token besides the top ones (as in vLLM). Values are
clamped at -9999.0 (JSON has no -inf), as vLLM does.
"""

from __future__ import annotations

from typing import Any

from mmserve.sampling_params import TokenLogprobs

_FLOOR = -9999.0


class LogprobsFormatter:
    """Formats one choice's token logprobs; ``next_delta`` formats only the tokens not yet
    sent (streaming), keeping the completions ``text_offset`` running across chunks."""

    def __init__(self, tokenizer: Any, kind: str) -> None:
        self.tokenizer = tokenizer
        self.chat = kind == "chat"
        self.sent = 0
        self.offset = 0
        self._texts: dict[int, str] = {}

    def _text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def format(self, logprobs: list[TokenLogprobs], text_offset: int) -> dict[str, Any]:
        if self.chat:
            return {"content": [self._chat_entry(lp) for lp in logprobs]}
        tokens, values, tops, offsets = [], [], [], []
        for lp in logprobs:
            text = self._text(lp.token_id)
            tokens.append(text)
            values.append(max(lp.logprob, _FLOOR))
            top = {self._text(t): max(v, _FLOOR) for t, v in lp.top}
            top.setdefault(text, max(lp.logprob, _FLOOR))
            tops.append(top)
            offsets.append(text_offset)
            text_offset += len(text)
        self.offset = text_offset
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def next_delta(self, logprobs: list[TokenLogprobs] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        new, self.sent = logprobs[self.sent :], len(logprobs)
        return self.format(new, self.offset)

    def _chat_entry(self, lp: TokenLogprobs) -> dict[str, Any]:
        return {
            **self._token(lp.token_id, lp.logprob),
            "top_logprobs": [self._token(t, v) for t, v in lp.top],
        }

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._text(token_id)
        return {
            "token": text,
            "logprob": max(logprob, _FLOOR),
            "bytes": list(text.encode("utf-8")),
        }


def format_prompt_logprobs(
    tokenizer: Any, entries: list[TokenLogprobs]
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a dict from
    token id to ``{"logprob", "rank", "decoded_token"}`` holding the prompt token itself and the
    top alternatives asked for."""
    texts: dict[int, str] = {}

    def entry(token_id: int, logprob: float, rank: int) -> dict[str, Any]:
        text = texts.get(token_id)
        if text is None:
            text = texts[token_id] = tokenizer.decode([token_id])
        return {"logprob": max(logprob, _FLOOR), "rank": rank, "decoded_token": text}

    out: list[dict[str, dict[str, Any]] | None] = [None]
    for lp in entries:
        position = {str(lp.token_id): entry(lp.token_id, lp.logprob, lp.rank)}
        for rank, (token_id, value) in enumerate(lp.top, start=1):
            position.setdefault(str(token_id), entry(token_id, value, rank))
        out.append(position)
    return out
