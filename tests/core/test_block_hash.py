"""Block hashes: chained, with labelled image keys and a first-block salt."""

from __future__ import annotations

import pytest

from mmserve.core.block_hash import BlockHasher, block_image_keys
from tests.support.scheduler import make_request

BS = 16


def hashes(request, algo="xxh3_128", seed=0):
    hasher = BlockHasher(algo, seed)
    hasher.extend(request, BS)
    return request.block_hashes


def test_image_spanning_three_blocks_gives_exact_extra_keys():
    # image a at 11..30 (19 embeddings), image b at 30..34, then text: blocks 0..2.
    req = make_request("r", [11, ("a", 19), ("b", 4), 14])
    assert block_image_keys(req, 0, 16) == (("a:19", 11),)  # key = hash + embedding count
    assert block_image_keys(req, 16, 32) == (("a:19", -5), ("b:4", 14))
    assert block_image_keys(req, 32, 48) == (("b:4", -2),)


def test_same_text_other_image_differs_from_the_images_first_block_on():
    one = hashes(make_request("1", [20, ("a", 20), 24]))
    two = hashes(make_request("2", [20, ("b", 20), 24]))
    assert one[0] == two[0]  # block 0 is text only
    assert all(x != y for x, y in zip(one[1:], two[1:], strict=True))


def test_same_image_same_place_matches_other_place_differs():
    base = hashes(make_request("1", [20, ("a", 20), 24]))
    assert hashes(make_request("2", [20, ("a", 20), 24])) == base
    shifted = hashes(make_request("3", [21, ("a", 20), 23]))
    assert shifted[0] == base[0] and shifted[1] != base[1]
    hasher = BlockHasher("xxh3_128", 0)
    tokens = [9] * BS  # identical token ids: only the image offset differs
    assert hasher.hash_block(hasher.root, tokens, (("a", 3),)) != hasher.hash_block(
        hasher.root, tokens, (("a", 4),)
    )


def test_salt_changes_first_block_and_so_the_whole_chain():
    plain = hashes(make_request("1", [64]))
    salted = hashes(make_request("2", [64], cache_salt="tenant-a"))
    other = hashes(make_request("3", [64], cache_salt="tenant-b"))
    assert len(plain) == 4
    assert all(p != s for p, s in zip(plain, salted, strict=True))
    assert all(s != o for s, o in zip(salted, other, strict=True))


def test_salt_and_image_labels_cannot_collide():
    hasher = BlockHasher("sha256", 0)
    tokens = list(range(BS))
    as_image = hasher.hash_block(hasher.root, tokens, (("x", 0),))
    as_salt = hasher.hash_block(hasher.root, tokens, (), salt="x")
    assert as_image != as_salt


def test_hashes_computed_once_and_extended_incrementally():
    req = make_request("r", [40])
    hasher = BlockHasher("xxh3_128", 0)
    hasher.extend(req, BS)
    assert hasher.num_hashed_blocks == 2
    hasher.extend(req, BS)
    assert hasher.num_hashed_blocks == 2
    for _ in range(8):
        req.append_output_token(5)
        hasher.extend(req, BS)
    assert hasher.num_hashed_blocks == 3 and len(req.block_hashes) == 3


@pytest.mark.parametrize("algo", ["sha256", "xxh3_128"])
def test_algorithms_are_deterministic_given_a_seed(algo):
    a = hashes(make_request("1", [20, ("a", 20), 24]), algo, seed=5)
    b = hashes(make_request("2", [20, ("a", 20), 24]), algo, seed=5)
    c = hashes(make_request("3", [20, ("a", 20), 24]), algo, seed=6)
    assert a == b and a[0] != c[0]
    assert all(len(h) >= 16 for h in a)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="md5"):
        BlockHasher("md5")
