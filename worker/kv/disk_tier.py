"""Glue between the block pool and the disk store: save evicted blocks, load them back.

Saving reads the evicted blocks' K/V off the pool once, at eviction (eviction happens between
steps, or while a pipelined step is queued), and hands host copies to the store's writer
thread. Loading reads the files and writes their K/V into freshly allocated blocks. Both go
through worker/kv/block_io.py (a quantized pool travels as its bytes: 2-4x smaller files).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from shared.hashing import hash_blocks
from worker.kv.block_io import read_blocks, write_blocks
from worker.kv.disk_store import DiskKVStore

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool


class DiskHit(NamedTuple):
    block_hash: int
    payload: np.ndarray  # (2, num_layers, block_size, num_kv_heads, head_dim)


class DiskTier:
    def __init__(self, pool: BlockPool, store: DiskKVStore):
        self.pool, self.store = pool, store
        self.hit_tokens = 0

    def save(self, block_ids, block_hashes, parent_hash: int, tokens) -> None:
        """Queue blocks leaving the prefix cache for the disk (those not there already)."""
        todo = [i for i, h in enumerate(block_hashes) if h not in self.store]
        if not todo:
            return
        payloads = read_blocks(self.pool, [block_ids[i] for i in todo])
        bs = self.pool.block_size
        for j, i in enumerate(todo):
            parent = block_hashes[i - 1] if i else parent_hash
            self.store.put(block_hashes[i], parent, tokens[i * bs : (i + 1) * bs], payloads[j])

    def find(self, tokens, start_block: int, max_blocks: int) -> list[DiskHit]:
        """The run of the prompt's full blocks from `start_block` on that the disk holds,
        at most `max_blocks`, each checked (tokens and checksum)."""
        bs = self.pool.block_size
        hashes = hash_blocks(tokens, bs)
        hits = []
        for i in range(start_block, min(len(hashes), start_block + max_blocks)):
            payload = self.store.get(hashes[i], tokens[i * bs : (i + 1) * bs])
            if payload is None:
                break
            hits.append(DiskHit(hashes[i], payload))
        return hits

    def load(self, block_ids: list[int], hits: list[DiskHit]) -> None:
        """Write the hits' K/V into `block_ids` (allocated, held by the caller)."""
        write_blocks(self.pool, block_ids, [h.payload for h in hits])
        self.hit_tokens += len(block_ids) * self.pool.block_size
