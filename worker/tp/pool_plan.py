"""What a tensor-parallel group's followers copy of the leader's KV pool (worker/tp/runner.py):
the same blocks and the same K/V layout, over their own KV heads."""

from __future__ import annotations

from typing import NamedTuple

from worker.kv.block_pool import BlockPool


class PoolPlan(NamedTuple):
    """The leader's pool as the followers copy it: blocks, block size, scratch block, and
    the K/V layout (`kv_bits` 0: unquantized, in the compute dtype)."""

    num_blocks: int
    block_size: int
    scratch_block: int
    kv_bits: int = 0
    kv_group_size: int = 0

    @classmethod
    def of(cls, pool: BlockPool, scratch_block: int) -> PoolPlan:
        quant = (pool.kv_bits, pool.kv_group_size) if pool.kv_bits else ()
        return cls(pool.num_blocks, pool.block_size, scratch_block, *quant)

    def encode(self) -> list[int]:
        return list(self)

    def pool(self, shape) -> BlockPool:
        """This rank's pool: its own KV heads (`shape`, probed on its shard), this layout."""
        return BlockPool(
            self.num_blocks,
            self.block_size,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=shape.kv_dtype,
            kv_bits=self.kv_bits or None,
            kv_group_size=self.kv_group_size or None,
        )
