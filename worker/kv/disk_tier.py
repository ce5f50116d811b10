"""Glue between the block pool and the disk store: save evicted blocks, load them back.

Saving reads the evicted blocks' K/V off the pool once, at eviction (an `mx.eval`, which waits
for a step in flight; eviction happens between steps, or while a pipelined step is queued),
and hands host copies to the store's writer thread. Loading reads the files and writes their
K/V into freshly allocated blocks with one scatter per layer, K and V. A quantized pool
(`--kv-bits`) travels as its bytes: each head vector's packed values, scales and biases side by
side in one row (2-4x smaller files), never dequantized on the way.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx
import numpy as np

from shared.hashing import hash_blocks
from worker.kv.disk_store import BlockLayout, DiskKVStore
from worker.kv.quant import QuantizedKV, pool_arrays

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool

# numpy has no bfloat16: such pools travel as their raw 16-bit words
_WIRE_DTYPES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "uint16"}


class DiskHit(NamedTuple):
    block_hash: int
    payload: np.ndarray  # (2, num_layers, block_size, num_kv_heads, head_dim)


def block_layout(pool: BlockPool) -> BlockLayout:
    k = pool.k[0]
    dims = (pool.num_layers, pool.block_size, k.shape[1], k.shape[2])
    if not isinstance(k, QuantizedKV):
        return BlockLayout(*dims, _WIRE_DTYPES[k.dtype])
    row_bytes = sum(a.shape[-1] * a.itemsize for a in k.arrays())
    quant = f"{pool.kv_layout}/{_WIRE_DTYPES[k.dtype]}"
    return BlockLayout(*dims, "uint8", quant=quant, row_bytes=row_bytes)


def model_fingerprint(model, layout: BlockLayout) -> str:
    """Names the model and the KV layout: parameter names, shapes, dtypes and a sample of
    each parameter's values; K/V saved under one fingerprint never load under another."""
    from mlx.utils import tree_flatten

    digest = hashlib.sha256((repr(layout) + layout.quant).encode())
    for name, param in sorted(tree_flatten(model.parameters()), key=lambda item: item[0]):
        sample = param.reshape(-1)[:64]
        if sample.dtype == mx.bfloat16:
            sample = sample.astype(mx.float32)
        digest.update(f"{name}{param.shape}{param.dtype}".encode())
        digest.update(np.array(sample).tobytes())
    return digest.hexdigest()[:24]


class DiskTier:
    def __init__(self, pool: BlockPool, store: DiskKVStore):
        self.pool, self.store = pool, store
        self.hit_tokens = 0

    def save(self, block_ids, block_hashes, parent_hash: int, tokens) -> None:
        """Queue blocks leaving the prefix cache for the disk (those not there already)."""
        todo = [i for i, h in enumerate(block_hashes) if h not in self.store]
        if not todo:
            return
        payloads = self._read_blocks([block_ids[i] for i in todo])
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
        bs = self.pool.block_size
        slots = mx.array([b * bs + o for b in block_ids for o in range(bs)], dtype=mx.int32)
        stacked = np.stack([h.payload for h in hits], axis=2)  # (2, L, n, bs, H, D)
        data = mx.array(stacked)
        if self.pool.k[0].dtype == mx.bfloat16 and self.pool.kv_bits is None:
            data = data.view(mx.bfloat16)
        data = data.reshape(2, self.pool.num_layers, len(block_ids) * bs, *data.shape[-2:])
        for layer in range(self.pool.num_layers):
            for i, pool in enumerate((self.pool.k[layer], self.pool.v[layer])):
                _store(pool, slots, data[i, layer])
        mx.eval(self.pool.k + self.pool.v)
        self.hit_tokens += len(block_ids) * bs

    def _read_blocks(self, block_ids: list[int]) -> list[np.ndarray]:
        bs = self.pool.block_size
        slots = mx.array([b * bs + o for b in block_ids for o in range(bs)], dtype=mx.int32)
        parts = [_row_bytes(pool, slots) for pool in (*self.pool.k, *self.pool.v)]
        stacked = mx.stack(parts).reshape(
            2, self.pool.num_layers, len(block_ids), bs, *parts[0].shape[-2:]
        )
        if stacked.dtype == mx.bfloat16:
            stacked = stacked.view(mx.uint16)
        host = np.array(stacked)  # evaluates: the copy no longer references the pool
        return [host[:, :, i] for i in range(len(block_ids))]


def _row_bytes(pool, slots: mx.array) -> mx.array:
    """A pool's `slots` as stored: the values, or a quantized pool's rows of bytes."""
    if not isinstance(pool, QuantizedKV):
        return pool[slots]
    return mx.concatenate([a[slots].view(mx.uint8) for a in pool.arrays()], axis=-1)


def _store(pool, slots: mx.array, data: mx.array) -> None:
    """Write `data` (as `_row_bytes` gives it) into a pool's `slots`, in place."""
    if not isinstance(pool, QuantizedKV):
        pool[slots] = data
        return
    start = 0
    for array in pool_arrays(pool):
        width = array.shape[-1] * array.itemsize
        array[slots] = data[..., start : start + width].view(array.dtype)
        start += width
