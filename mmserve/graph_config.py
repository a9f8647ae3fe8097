"""Which decode steps run at fixed shapes (CUDA graphs): the batch-size and context-length
buckets, resolved once from the engine settings (torch-free).

vLLM's settings, same names: ``enforce_eager`` turns graphs off; ``cuda_graph_sizes`` picks
the batch sizes (one value N: 1, 2, 4 and the multiples of 8 up to N; several: those);
``max_seq_len_to_capture`` is the longest context a graph covers. mmserve's decode attention
under a graph reads a fixed number of key positions, so graphs are keyed by a context bucket
too: powers of two from ``MIN_CONTEXT_BUCKET`` tokens up to that length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_CONTEXT_BUCKET = 256  # tokens: the smallest context bucket (rounded up to whole blocks)
MAX_DEFAULT_BATCH = 512  # vLLM's cap on the default capture sizes


def pattern_sizes(largest: int) -> list[int]:
    """vLLM's capture sizes up to ``largest``: 1, 2, 4, then every multiple of 8."""
    return [s for s in (1, 2, 4) if s <= largest] + list(range(8, largest + 1, 8))


def batch_buckets(sizes: Sequence[int] | None, max_num_seqs: int) -> tuple[int, ...]:
    """Ascending batch buckets. ``sizes`` None: the pattern up to ``max_num_seqs`` plus its
    next size, so every batch the scheduler can form has one; one value: the pattern up to
    it; several: those. Sizes above the first one that holds ``max_num_seqs`` never run and
    are dropped."""
    if sizes is None:
        largest = min(max_num_seqs, MAX_DEFAULT_BATCH)
        chosen = pattern_sizes(largest)
        if chosen[-1] < largest:
            chosen.append(pattern_sizes(largest + 8)[len(chosen)])
    elif len(sizes) == 1:
        chosen = pattern_sizes(sizes[0])
    else:
        chosen = sorted(set(sizes))
    if not chosen or chosen[0] < 1:
        raise ValueError(f"cuda_graph_sizes must be positive batch sizes, got {list(sizes or [])}")
    covering = [s for s in chosen if s >= max_num_seqs]
    return tuple(s for s in chosen if not covering or s <= covering[0])


def context_buckets(max_context: int, block_size: int) -> tuple[int, ...]:
    """Ascending context buckets in tokens, whole blocks each: ``MIN_CONTEXT_BUCKET`` doubling
    while below ``max_context``, then ``max_context`` itself (rounded up to a block)."""
    if max_context < 1:
        raise ValueError(f"max_seq_len_to_capture must be >= 1, got {max_context}")
    blocks = -(-MIN_CONTEXT_BUCKET // block_size)
    last = -(-max_context // block_size)
    out = []
    while blocks < last:
        out.append(blocks * block_size)
        blocks *= 2
    return (*out, last * block_size)


@dataclass(frozen=True)
class DecodeGraphConfig:
    """Decode steps replayed at fixed shapes: CUDA graphs when ``capture`` (CUDA), the same
    padded static-shape path without capture otherwise (the CPU tests and dry run).

    Invariants: ``batch_sizes`` and ``context_sizes`` are ascending and positive; every context
    size is a multiple of ``block_size``. A decode step of B sequences, none longer than L
    tokens, runs bucket (smallest batch size >= B, smallest context size >= L) when both
    exist, and eagerly otherwise.
    """

    batch_sizes: tuple[int, ...]
    context_sizes: tuple[int, ...]
    block_size: int
    capture: bool

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def max_context(self) -> int:
        return self.context_sizes[-1]

    def bucket(self, batch: int, context: int) -> tuple[int, int]:
        """The (batch, context) bucket of a step (ValueError past the largest)."""
        for b in self.batch_sizes:
            if b >= batch:
                for c in self.context_sizes:
                    if c >= context:
                        return b, c
        raise ValueError(f"no graph bucket holds {batch} sequences of {context} tokens")

    def describe(self) -> str:
        return (
            f"batch {', '.join(map(str, self.batch_sizes))} x context"
            f" {', '.join(map(str, self.context_sizes))}"
        )

    @classmethod
    def resolve(
        cls,
        enforce_eager: bool | None,
        cuda_graph_sizes: Sequence[int] | None,
        max_seq_len_to_capture: int,
        device: str,
        *,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
    ) -> DecodeGraphConfig | None:
        """None when decode runs eagerly: ``enforce_eager``, or unset off CUDA. An explicit
        ``enforce_eager=False`` off CUDA gives the padded static-shape path (no capture)."""
        on_cuda = device.split(":")[0] == "cuda"
        if enforce_eager or (enforce_eager is None and not on_cuda):
            return None
        return cls(
            batch_buckets(cuda_graph_sizes, max_num_seqs),
            context_buckets(min(max_seq_len_to_capture, max_model_len), block_size),
            block_size,
            capture=on_cuda,
        )
