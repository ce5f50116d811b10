"""Worker KV memory: the paged block pool and the radix prefix cache."""

from worker.kv.block_pool import DEFAULT_BLOCK_SIZE, BlockPool, PoolUsage
from worker.kv.errors import IntegrityError, KVCacheError, OutOfBlocksError
from worker.kv.memory import (
    bytes_per_block,
    device_memory_bytes,
    memory_budget_bytes,
    num_blocks_for_budget,
)
from worker.kv.radix_cache import MatchResult, RadixCache
from worker.kv.radix_node import RadixNode

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BlockPool",
    "IntegrityError",
    "KVCacheError",
    "MatchResult",
    "OutOfBlocksError",
    "PoolUsage",
    "RadixCache",
    "RadixNode",
    "bytes_per_block",
    "device_memory_bytes",
    "memory_budget_bytes",
    "num_blocks_for_budget",
]
