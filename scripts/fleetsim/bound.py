"""The capacity bound: the hit rate of one LRU cache as large as the whole fleet's KV, fed the
same requests in order (no request holds blocks: an upper estimate of what any routing of this
traffic over the fleet could hit with LRU caches)."""

from __future__ import annotations

from collections.abc import Sequence

from scripts.fleetsim.block_lru import BlockLRU
from scripts.fleetsim.workload import SimRequest
from shared.hashing import hash_blocks


def pooled_lru_hit_rate(
    requests: Sequence[SimRequest], capacity_blocks: int, block_size: int, warmup: int = 0
) -> float:
    """Hit rate (cached / prompt tokens) after the first `warmup` requests."""
    cache = BlockLRU(capacity_blocks)
    hit = total = 0
    for k, request in enumerate(requests):
        hashes = hash_blocks(request.token_ids, block_size)
        matched = cache.admit(hashes, request.token_ids, block_size, 0)
        cache.release(hashes, 0)
        if k >= warmup:
            hit += matched * block_size
            total += len(request.token_ids)
    return hit / max(1, total)
