"""One sliding-window (local) layer's torch paged attention: before the windowed gather
(whole context gathered, then masked; the modules as of commit f6ed2dd, read with ``git show``)
vs now (only the window gathered), interleaved in one process.

    python benchmarks/gemma_window_attention.py [--rounds 15] [--threads 2]

One step: 4 decodes + one 256-token prefill chunk, each at an 8192-token context, Gemma-3-4b
heads (8 query, 4 KV, head_dim 256), window 1024, float32 on the CPU. The step's attention plan
(shared by every local layer) is built outside the timing. Prints the largest output difference
and, per side, the median, interquartile range and min-max milliseconds. Raises its own
scheduling priority when it can (``/proc/self/autogroup``, root only). Needs the git history.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from mmserve.bench.lib.priority import add_priority_arg, apply_priority
from mmserve.layers import attention_torch as current

BEFORE = "f6ed2dd"  # the last commit whose local layers gathered the whole context
HEADS, KV_HEADS, HEAD_DIM, WINDOW, BLOCK = 8, 4, 256, 1024, 16
CONTEXT, DECODES, CHUNK = 8192, 4, 256


def module_before(folder: Path) -> ModuleType:
    """``attention_torch`` as of ``BEFORE``, importing its ``attention_masks`` of then."""
    repo = Path(__file__).resolve().parents[1]
    for name in ("attention_masks", "attention_torch"):
        source = subprocess.run(
            ["git", "-C", str(repo), "show", f"{BEFORE}:mmserve/layers/{name}.py"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        source = source.replace("mmserve.layers.attention_masks", "before_attention_masks")
        (folder / f"before_{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    return importlib.import_module("before_attention_torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    add_priority_arg(parser)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the spread needs quartiles)")
    apply_priority(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    seqs = [(CONTEXT, 1)] * DECODES + [(CONTEXT, CHUNK)]
    blocks_per_seq = -(-CONTEXT // BLOCK)
    num_blocks = blocks_per_seq * len(seqs) + 1
    table = (torch.randperm(num_blocks - 1) + 1).view(len(seqs), blocks_per_seq)
    k_cache = torch.randn(num_blocks * BLOCK, KV_HEADS, HEAD_DIM)
    v_cache = torch.randn(num_blocks * BLOCK, KV_HEADS, HEAD_DIM)
    tokens = sum(n for _, n in seqs)
    q = torch.randn(tokens, HEADS, HEAD_DIM)
    k, v = torch.randn(tokens, KV_HEADS, HEAD_DIM), torch.randn(tokens, KV_HEADS, HEAD_DIM)
    q_lens, lens = [n for _, n in seqs], [t for t, _ in seqs]
    with tempfile.TemporaryDirectory() as folder:
        before = module_before(Path(folder))
        sides = {"before": before, "now": current}
        plans = {
            n: m.TorchAttentionPlan.build(table, q_lens, lens, BLOCK) for n, m in sides.items()
        }

        def run(name: str) -> tuple[float, torch.Tensor]:
            start = time.perf_counter()
            out = sides[name].torch_paged_attention(
                k_cache, v_cache, q, k, v, plans[name], HEAD_DIM**-0.5, WINDOW
            )
            return time.perf_counter() - start, out

        diff = float((run("before")[1] - run("now")[1]).abs().max())  # also warms both up
        print(f"largest output difference {diff:.2e}")
        times: dict[str, list[float]] = {"before": [], "now": []}
        for r in range(args.rounds):
            for name in ("before", "now") if r % 2 == 0 else ("now", "before"):
                times[name].append(run(name)[0] * 1e3)
    for name, values in times.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        print(
            f"{name:6s} median {statistics.median(values):7.1f} ms  IQR {q1:.1f}-{q3:.1f}"
            f"  min-max {min(values):.1f}-{max(values):.1f}  n={len(values)}"
        )


if __name__ == "__main__":
    main()
