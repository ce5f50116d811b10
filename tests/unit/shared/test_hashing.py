"""Pins shared.hashing: the router and every worker must agree on these values forever."""

import hashlib
import struct

from shared.hashing import HASH_SEED, ROOT_PARENT_HASH, hash_block, hash_blocks

# Computed once from the implementation; a change here breaks routing across versions.
PINNED_BLOCKS = [
    (0, (1, 2, 3, 4), 15792433876775578825),
    (0, (), 7518815712909782491),
    (12345, (0,), 7593964848729296558),
    (0, (65536, 70000, 2**32 - 1), 10787615197378093893),
]


def test_pinned_block_hashes():
    for parent, tokens, expected in PINNED_BLOCKS:
        assert hash_block(parent, tokens) == expected


def test_pinned_chains():
    assert hash_blocks(list(range(10)), 4) == [18333328609170194911, 10611436359856669280]
    assert hash_blocks([7] * 8, 4, parent_hash=99) == [16954620599522011490, 4804028451109654176]


def test_matches_the_documented_format():
    """blake2b-64 keyed with the seed, over the parent as u64 LE then tokens as u32 LE."""
    parent, tokens = 0xDEADBEEF, [3, 70000, 2**31]
    payload = struct.pack("<Q", parent) + struct.pack("<3I", *tokens)
    digest = hashlib.blake2b(payload, digest_size=8, key=HASH_SEED).digest()
    assert hash_block(parent, tokens) == int.from_bytes(digest, "little")


def test_root_parent_is_zero():
    assert ROOT_PARENT_HASH == 0
    assert hash_blocks([1, 2], 2) == [hash_block(0, [1, 2])]


def test_chained_different_parent_different_hash():
    assert hash_block(1, [5, 6]) != hash_block(2, [5, 6])
    first, second = hash_blocks([1, 2, 5, 6], 2)
    assert second == hash_block(first, [5, 6])
    assert second != hash_blocks([5, 6], 2)[0]  # same tokens, different position


def test_tokens_are_32_bit_not_16_bit():
    """Tokens >= 2**16 must not alias their low 16 bits (vocabularies pass 65536)."""
    assert hash_block(0, [1]) != hash_block(0, [1 + 2**16])
    assert hash_block(0, [2**16]) != hash_block(0, [0])


def test_partial_tail_not_hashed():
    assert len(hash_blocks(list(range(7)), 4)) == 1
    assert hash_blocks(list(range(7)), 4) == hash_blocks(list(range(4)), 4)
    assert hash_blocks([1, 2, 3], 4) == []


def test_hash_is_a_u64():
    for parent, tokens, _ in PINNED_BLOCKS:
        assert 0 <= hash_block(parent, tokens) < 2**64
