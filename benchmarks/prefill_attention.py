"""Prefill (and decode) attention over the paged KV cache: mmserve's CPU kernel (every row of
the step in one call, keys read in place) against the torch path (each sequence's keys gathered
into a copy, then SDPA with a causal or offset-causal mask), at the shapes of served models.

Each case is one layer's attention of one step: ``seqs`` of (keys after the step, query rows
this step), the step's own keys written to the cache first (both paths). The paths alternate
within each of ``--rounds`` rounds; the table gives each path's median (min-max) ms and the
GFLOP/s of the causal attention it computes (4 * query heads * head_dim per visible key) and
the rate of reading the step's keys and values once (what bounds a decode).
Run as root on a quiet machine after ``echo -20 > /proc/self/autogroup``:

    python benchmarks/prefill_attention.py --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mmserve.layers.attention import AttentionMetadata, PagedKVCache, paged_attention

# name -> (heads, kv heads, head dim, block size, [(keys after the step, queries)])
CASES: dict[str, tuple[int, int, int, int, list[tuple[int, int]]]] = {
    "toy LM, 7 fresh prompts of 290": (8, 4, 64, 16, [(290, 290)] * 7),
    "toy LM, 7 prompts of 290 after 400 cached": (8, 4, 64, 16, [(690, 290)] * 7),
    "Qwen2-VL-2B LM, 255 after 608": (12, 2, 128, 16, [(863, 255)]),
    "Qwen2-VL-2B LM, fresh 1,000": (12, 2, 128, 16, [(1000, 1000)]),
    "SmolLM2-135M, 522 after 1,376": (9, 3, 64, 16, [(1898, 522)]),
    "SmolLM2-135M, chunk of 64 after 1,500": (9, 3, 64, 16, [(1564, 64)]),
    "toy LM, decode step of 64 sequences of 330": (8, 4, 64, 16, [(330, 1)] * 64),
    "Qwen2-VL-2B LM, decode step of 8 of 900": (12, 2, 128, 16, [(900, 1)] * 8),
    "Qwen2-VL-2B LM, decode of 1 of 900": (12, 2, 128, 16, [(900, 1)]),
    "SmolLM2-135M, decode of 1 of 300": (9, 3, 64, 16, [(300, 1)]),
    "SmolLM2-135M, decode of 1 of 1,900": (9, 3, 64, 16, [(1900, 1)]),
    "SmolLM2-135M, decode step of 8 of 1,900": (9, 3, 64, 16, [(1900, 1)] * 8),
}


def visible_keys(seqs: list[tuple[int, int]]) -> int:
    """Keys summed over query rows: row i of n after t - n earlier keys sees t - n + i + 1."""
    return sum(n * (total - n) + n * (n + 1) // 2 for total, n in seqs)


def build(
    case: tuple[int, int, int, int, list[tuple[int, int]]], use_kernel: bool, dtype: torch.dtype
):
    heads, kv_heads, head_dim, block_size, seqs = case
    blocks = [-(-total // block_size) for total, _ in seqs]
    num_blocks = sum(blocks) + 1
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, torch.device("cpu"))
    cache.keys[0].normal_()
    cache.values[0].normal_()
    perm = torch.randperm(num_blocks)
    tables, used = [], 0
    for n in blocks:
        tables.append(perm[used : used + n])
        used += n
    table = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True)
    q_lens = torch.tensor([n for _, n in seqs])
    lens = torch.tensor([total for total, _ in seqs])
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.long)
    torch.cumsum(q_lens, 0, out=qsl[1:])
    row = torch.repeat_interleave(torch.arange(len(seqs)), q_lens)
    pos = torch.arange(int(qsl[-1])) - qsl[row] + (lens - q_lens)[row]
    slots = table[row, pos // block_size] * block_size + pos % block_size
    tokens = int(qsl[-1])
    q = torch.randn(tokens, heads, head_dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)
    v = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)

    def run() -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=qsl.int(),
            seq_lens=lens.int(),
            block_tables=table.int(),
            block_size=block_size,
            query_lens_host=[n for _, n in seqs],
            seq_lens_host=[total for total, _ in seqs],
            use_kernel=use_kernel,
        )
        return paged_attention(0, cache, q, k, v, meta, head_dim**-0.5)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--cases", default="", help="run only the cases whose name has this text")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{args.threads} threads, {args.dtype}")
    print("| case | path | ms | GFLOP/s | K/V read once, GB/s |\n|---|---|---|---|---|")
    for name, case in CASES.items():
        if args.cases not in name:
            continue
        heads, kv_heads, head_dim, _, seqs = case
        flops = 4 * heads * head_dim * visible_keys(seqs)
        kv_bytes = 2 * kv_heads * head_dim * dtype.itemsize * sum(total for total, _ in seqs)
        paths = {"kernel": build(case, True, dtype), "gather + SDPA": build(case, False, dtype)}
        times: dict[str, list[float]] = {p: [] for p in paths}
        for run in paths.values():
            run()  # warm-up
        for _ in range(args.rounds):
            for path, run in paths.items():
                start = time.perf_counter()
                run()
                times[path].append(time.perf_counter() - start)
        for path, ts in times.items():
            med = statistics.median(ts)
            print(
                f"| {name} | {path} | {med * 1e3:.2f} ({min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f})"
                f" | {flops / med / 1e9:.0f} | {kv_bytes / med / 1e9:.1f} |"
            )


if __name__ == "__main__":
    main()
