"""Engine decode cost with and without a grammar: 8 greedy requests, 48 tokens each, on
tiny-qwen2-vl, 7 interleaved rounds, median (min-max) ms per generated token.

    flock /tmp/mmserve-timing.lock python benchmarks/grammar_engine_overhead.py
"""

import json
import statistics
import time

import torch

from mmserve import LLM, SamplingParams, StructuredOutputsParams

PROMPTS = [f"Request {i}: describe a thing" for i in range(8)]
REGEX = StructuredOutputsParams(regex=r"[a-z ]{48}")


def run(llm: LLM, constraint: StructuredOutputsParams | None) -> float:
    """ms per generated token of one batch."""
    params = SamplingParams(
        temperature=0, max_tokens=48, ignore_eos=True, structured_outputs=constraint
    )
    t = time.perf_counter()
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return (time.perf_counter() - t) / n * 1e3


def main(rounds: int = 7) -> None:
    torch.set_num_threads(2)
    llm = LLM("tiny-qwen2-vl")
    run(llm, None)
    run(llm, REGEX)
    res: dict[str, list[float]] = {"plain": [], "regex": []}
    for _ in range(rounds):  # interleaved A/B rounds
        res["plain"].append(run(llm, None))
        res["regex"].append(run(llm, REGEX))
    summary = {
        k: f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f}) ms/token"
        for k, v in res.items()
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
