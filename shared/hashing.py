"""Chained 64-bit block hashes, identical on every process and host.

hash(block) = blake2b-64(seed, parent hash as u64 LE, token ids as u32 LE).
The router hashes prompts with this and the workers hash the blocks they cache,
so a change here silently breaks routing: tests pin known values.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Sequence

HASH_SEED = b"mlx-fleet/v1"
ROOT_PARENT_HASH = 0  # the parent hash of a sequence's first block

_U64 = struct.Struct("<Q")


def _u32_le(token_ids: Sequence[int]) -> bytes:
    arr = array("I", token_ids)
    if arr.itemsize != 4:  # pragma: no cover - every platform we run on has 4-byte unsigned int
        raise RuntimeError("array('I') is not 32-bit here")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian host
        arr.byteswap()
    return arr.tobytes()


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The 64-bit hash of one block, chained on its parent's hash."""
    h = hashlib.blake2b(digest_size=8, key=HASH_SEED)
    h.update(_U64.pack(parent_hash))
    h.update(_u32_le(token_ids))
    return int.from_bytes(h.digest(), "little")


def hash_blocks(
    token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_PARENT_HASH
) -> list[int]:
    """Chained hashes of every full block of `token_ids` (a partial tail is not hashed)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_block(parent_hash, token_ids[start : start + block_size])
        hashes.append(parent_hash)
    return hashes
