"""Request streams shared by the offline (``reuse``), server (``serve``) and vLLM benchmarks.

A request is a ``Spec`` (text prefix id, image id, request number); it renders to OpenAI-style
chat messages (system prefix + user image + question) so every engine sees the same prompt
through its own chat template. ``run`` salts prefixes and image seeds, so repeated runs on one
engine never hit each other's caches.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from typing import Any

TOPICS = ["a harbour", "a market", "a forest trail", "a kitchen", "a train station", "a garden"]
RUN_STRIDE = 100_000  # image seeds of run r live in [r * RUN_STRIDE, (r + 1) * RUN_STRIDE)
WARMUP_RUN = 99


@dataclass(frozen=True)
class Spec:
    """One request: which text prefix, which image, which question number."""

    prefix: int
    image: int
    index: int
    run: int = 0

    @property
    def image_seed(self) -> int:
        return self.run * RUN_STRIDE + self.image

    def system(self) -> str:
        return (
            f"Session {self.run}-{self.prefix}: you are looking at a photo taken near "
            f"{TOPICS[self.prefix % len(TOPICS)]}. Answer briefly and precisely about the "
            "shapes, colors and text you see."
        )

    def question(self) -> str:
        return f"Question {self.index}: what stands out?"

    def messages(self, image_part: dict[str, Any]) -> list[dict[str, Any]]:
        """Chat messages with ``image_part`` (an ``image`` or ``image_url`` content part)."""
        return [
            {"role": "system", "content": self.system()},
            {"role": "user", "content": [image_part, {"type": "text", "text": self.question()}]},
        ]


def reuse_specs(
    num_requests: int, reuse: float, grouped: bool, seed: int = 0, run: int = 0
) -> list[Spec]:
    """A fraction ``reuse`` of requests repeat an earlier (prefix, image) pair with a new
    question; ``grouped`` puts repeats next to their original, else the order is shuffled."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    fresh = 0
    for _ in range(num_requests):
        if pairs and rng.random() < reuse:
            pairs.append(rng.choice(pairs))
        else:
            pairs.append((fresh, fresh))
            fresh += 1
    if grouped:
        pairs.sort(key=lambda p: p[0])
    else:
        rng.shuffle(pairs)
    return [Spec(p, i, n, run) for n, (p, i) in enumerate(pairs)]


def zipf_specs(
    num_requests: int, distinct: int, exponent: float = 1.1, seed: int = 0, run: int = 0
) -> list[Spec]:
    """Every request its own text prefix (only the encoder cache can help); its image drawn
    from ``distinct`` images with P(k) proportional to 1 / k**exponent."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** exponent for k in range(distinct)]
    images = rng.choices(range(distinct), weights=weights, k=num_requests)
    return [Spec(n, image, n, run) for n, image in enumerate(images)]


def with_single_image(specs: list[Spec], run: int) -> list[Spec]:
    """The same requests, all showing image 0: the LM-only floor (one encode in total)."""
    return [Spec(s.prefix, 0, s.index, run) for s in specs]


def warmup_specs(count: int = 2) -> list[Spec]:
    return [Spec(i, i, i, WARMUP_RUN) for i in range(count)]


def distinct_images(specs: list[Spec]) -> int:
    return len({s.image_seed for s in specs})


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[rank]


def latency_summary(values: list[float], prefix: str) -> dict[str, float]:
    """mean / p50 / p90 / p99 of ``values`` under keys ``{prefix}_mean_s`` etc."""
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered) if ordered else float("nan")
    out = {f"{prefix}_mean_s": mean}
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}_s"] = percentile(ordered, q)
    return out


def workload_specs(args: argparse.Namespace, run: int) -> list[Spec]:
    """The request stream ``args`` (``bench serve`` / ``--launch`` flags) ask for, salted by
    ``run``."""
    if args.zipf:
        return zipf_specs(args.requests, args.distinct, seed=args.seed, run=run)
    return reuse_specs(args.requests, args.reuse, args.order == "grouped", args.seed, run)


def workload_kind(args: argparse.Namespace) -> str:
    """The workload's name in result files."""
    return f"zipf_D{args.distinct}" if args.zipf else f"{round(args.reuse * 100)}pct_{args.order}"
