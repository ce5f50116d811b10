"""A worker's prefix cache at the level of block hashes: what the router can see of it.

Same contract as worker/kv/radix_cache.py where the router notices: a prompt matches its
longest cached leading run of blocks; blocks of running requests are locked; out of room, the
least recently used unlocked blocks go first, deepest first (a parent is touched after its
children, so a chain is evicted from its tail, as the radix tree evicts leaves); every block
that enters or leaves is announced as a BlockStored / BlockRemoved event. No K/V is allocated.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from shared.hashing import ROOT_PARENT_HASH
from shared.kv_events import BlockRemoved, BlockStored, KVEvent


class BlockLRU:
    def __init__(self, capacity_blocks: int, emit: Callable[[KVEvent], None] | None = None):
        self.capacity_blocks = capacity_blocks
        self._emit = emit or (lambda event: None)
        self._lru: OrderedDict[int, None] = OrderedDict()  # first = least recently used
        self._locks: Counter[int] = Counter()
        self.private_blocks = 0  # blocks held by running requests outside the cache
        self.evicted_blocks = 0  # cumulative

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def used_blocks(self) -> int:
        return len(self._lru) + self.private_blocks

    @property
    def free_blocks(self) -> int:
        return max(0, self.capacity_blocks - self.used_blocks)

    @property
    def evictable_blocks(self) -> int:
        return len(self._lru) - len(self._locks)

    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` cached (no mutation)."""
        for depth, block_hash in enumerate(hashes):
            if block_hash not in self._lru:
                return depth
        return len(hashes)

    def admit(
        self, hashes: Sequence[int], tokens: Sequence[int], block_size: int, private: int
    ) -> int:
        """Mutates: cache and lock every block of `hashes`, reserve `private` more blocks,
        evict what no longer fits; returns how many leading blocks were already cached."""
        matched = self.match(hashes)
        for depth in range(matched, len(hashes)):
            self._lru[hashes[depth]] = None
            parent = hashes[depth - 1] if depth else ROOT_PARENT_HASH
            block = tuple(tokens[depth * block_size : (depth + 1) * block_size])
            self._emit(BlockStored(hashes[depth], parent, block, block_size))
        for block_hash in reversed(hashes):  # the root ends most recent: tails go first
            self._lru.move_to_end(block_hash)
            self._locks[block_hash] += 1
        self.private_blocks += private
        self._evict_overflow()
        return matched

    def release(self, hashes: Sequence[int], private: int) -> None:
        """Mutates: unlock a finished request's blocks and free its private ones."""
        for block_hash in hashes:
            self._locks[block_hash] -= 1
            if self._locks[block_hash] <= 0:
                del self._locks[block_hash]
        self.private_blocks -= private
        self._evict_overflow()

    def _evict_overflow(self) -> None:
        overflow = self.used_blocks - self.capacity_blocks
        if overflow <= 0:
            return
        removed = []
        for block_hash in self._lru:  # least recently used first
            if len(removed) == overflow:
                break
            if block_hash not in self._locks:
                removed.append(block_hash)
        for block_hash in removed:
            del self._lru[block_hash]
        if removed:
            self.evicted_blocks += len(removed)
            self._emit(BlockRemoved(tuple(removed)))
