"""Image-affinity placement: rendezvous (highest-random-weight) hashing with bounded load.

Pure functions over replica ids and in-flight counts (no Ray): the Ray router calls them, the
unit tests check them directly.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mmserve.inputs import ProcessedPrompt

LEADING_TOKENS = 64  # text-only requests: the prompt's first tokens pick the replica
DEFAULT_LOAD_FACTOR = 1.25


@dataclass(frozen=True)
class RouteKey:
    """What the router may read about a request: hashes, never pixels or text.

    ``anchor`` is the first image's encoder-cache key (content hash + embedding count, already
    salted with the tenant's ``cache_salt``), or for a text-only prompt a hash of its leading
    tokens (salted too). A chat re-sends its history each turn, so the first image, and with it
    the replica, stays the same while later turns append images. ``pin`` sends the call to one
    replica (internal calls such as per-replica stats), bypassing affinity and the load bound.
    """

    anchor: str = ""
    has_images: bool = False
    pin: str | None = None


def route_key(processed: ProcessedPrompt, cache_salt: str | None) -> RouteKey:
    """The route key of an admitted prompt."""
    if processed.mm_items:
        return RouteKey(processed.mm_items[0].key, has_images=True)
    head = processed.prompt_token_ids[:LEADING_TOKENS]
    digest = hashlib.blake2b(digest_size=16)
    digest.update((cache_salt or "").encode() + b"\0")
    digest.update(",".join(map(str, head)).encode())
    return RouteKey("text:" + digest.hexdigest())


def _weight(replica_id: str, anchor: str) -> int:
    digest = hashlib.blake2b(f"{replica_id}\0{anchor}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(replica_ids: Sequence[str], anchor: str) -> list[str]:
    """Replicas by descending rendezvous weight for ``anchor``: adding or removing a replica
    moves only the anchors whose first choice it is (or becomes)."""
    return sorted(replica_ids, key=lambda r: (_weight(r, anchor), r), reverse=True)


def load_cap(total_in_flight: int, num_replicas: int, load_factor: float) -> int:
    """The most requests one replica may hold once the new one is placed:
    ``ceil(c * (in_flight + 1) / n)`` (consistent hashing with bounded loads, Mirrokni et al.).
    At least one replica is always under it, since the mean is below it for c >= 1."""
    return max(1, math.ceil(load_factor * (total_in_flight + 1) / num_replicas))


@dataclass(frozen=True)
class Placement:
    """A routing decision: replicas in the order to try, whether the affinity choice was
    skipped for load, and the cap it was measured against."""

    order: list[str]
    spilled: bool
    cap: int


def place(ranked: Sequence[str], in_flight: Mapping[str, int], load_factor: float) -> Placement:
    """The replicas of ``ranked`` still under the load cap, in rank order: the first goes first,
    the others are the fallbacks Ray tries when it finds the first one's queue full or its
    queue-length probe late. A replica at the cap is no fallback: Ray would send it one more."""
    if not ranked:
        return Placement([], False, 0)
    cap = load_cap(sum(in_flight.get(r, 0) for r in ranked), len(ranked), load_factor)
    under = [r for r in ranked if in_flight.get(r, 0) + 1 <= cap]
    if not under:
        return Placement(list(ranked), False, cap)  # unreachable for load_factor >= 1
    return Placement(under, under[0] != ranked[0], cap)
