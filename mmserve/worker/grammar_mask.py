"""Per-request grammar matchers and the batched token mask they put on the logits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def new_matcher(compiled: Any) -> Any:
    """A fresh xgrammar matcher at the start of ``compiled`` (a ``CompiledGrammar``)."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(compiled)


class GrammarMask:
    """Masks the tokens each constrained row's grammar cannot accept, for a whole batch.

    One packed int32 bitmask buffer ([rows, ceil(vocab / 32)]) is kept, regrown when a batch
    has more rows; per step each constrained row's matcher fills its row and one
    ``apply_token_bitmask_inplace`` call sets the disallowed logits of all those rows to -inf.
    Rows without a matcher (or whose matcher has terminated) are untouched. Matchers advance
    only with tokens sampled under their mask, so they always accept them.
    """

    def __init__(self) -> None:
        self._bitmask: torch.Tensor | None = None

    def _buffer(self, rows: int, vocab_size: int) -> torch.Tensor:
        words = (vocab_size + 31) // 32
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < rows or bitmask.shape[1] != words:
            import xgrammar as xgr

            bitmask = self._bitmask = xgr.allocate_token_bitmask(rows, vocab_size)
        return bitmask

    def apply(self, logits: torch.Tensor, matchers: Sequence[Any]) -> torch.Tensor:
        """float32 logits with each constrained row masked (``logits`` itself when it already
        is float32)."""
        import xgrammar as xgr

        rows = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
        if not rows:
            return logits
        vocab_size = logits.shape[-1]
        bitmask = self._buffer(len(logits), vocab_size)
        for row in rows:
            matchers[row].fill_next_token_bitmask(bitmask, row)
        out = logits.float()
        cpu = out.device.type == "cpu"
        xgr.apply_token_bitmask_inplace(
            out,
            bitmask[: len(logits)].to(out.device),
            vocab_size=vocab_size,
            indices=rows,
            backend="cpu" if cpu else "torch_native",
        )
        return out

    @staticmethod
    def advance(matchers: Sequence[Any], tokens: Sequence[int]) -> None:
        """Feed each constrained row its sampled token."""
        for matcher, token in zip(matchers, tokens, strict=True):
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(token)
