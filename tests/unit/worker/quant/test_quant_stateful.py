"""The pool's stateful property test (tests/unit/worker/kv/test_kv_stateful.py) over a pool of
quantized layouts: the same books, and cached blocks' packed values, scales and biases never
change under copy-on-write, eviction and reuse."""

import mlx.core as mx
import numpy as np
from hypothesis import settings

from tests.unit.worker.kv.test_kv_stateful import BS, NUM_BLOCKS, KVMachine
from worker.kv import BlockPool, RadixCache

HEAD_DIM = 32


class QuantizedKVMachine(KVMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(
            NUM_BLOCKS,
            BS,
            num_layers=1,
            num_kv_heads=1,
            head_dim=HEAD_DIM,
            dtype=mx.float32,
            kv_bits=4,
            kv_group_size=32,
        )
        self.events.clear()
        self.cache = RadixCache(self.pool, BS, on_event=self.events.append)

    def write(self, block, offsets):
        ramp = mx.arange(HEAD_DIM, dtype=mx.float32).reshape(1, 1, HEAD_DIM)
        for offset in offsets:
            slot = mx.array([block * BS + offset], dtype=mx.int32)
            self.pool.k[0][slot] = ramp * self.next_value
            self.pool.v[0][slot] = ramp - self.next_value
            self.next_value += 1.0

    def block_kv(self, block):
        span = slice(block * BS, (block + 1) * BS)
        k, v = self.pool.k[0], self.pool.v[0]
        return (
            np.concatenate([np.array(a[span]).view(np.uint8).ravel() for a in k.arrays()]),
            np.concatenate([np.array(a[span]).view(np.uint8).ravel() for a in v.arrays()]),
        )


QuantizedKVMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestQuantizedKVStateful = QuantizedKVMachine.TestCase
