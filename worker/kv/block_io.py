"""Blocks of the KV pool as host bytes, and back: what the disk tier saves and loads and what
peers fetch from one another (worker/peer), one code path for both.

A block's payload is a numpy array (2, num_layers, block_size, num_kv_heads, row), K then V,
as the pool stores it: the values (bfloat16 as its raw 16-bit words: numpy has none), or a
quantized pool's (`--kv-bits`) rows of packed values, scales and biases side by side, never
dequantized on the way. Reading evaluates (an `mx.eval`, which waits for a step in flight); the
host copy no longer references the pool.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from worker.kv.disk_store import BlockLayout
from worker.kv.quant import QuantizedKV, pool_arrays

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool

# numpy has no bfloat16: such pools travel as their raw 16-bit words
_WIRE_DTYPES = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "uint16"}


def block_layout(pool: BlockPool) -> BlockLayout:
    k = pool.k[0]
    dims = (pool.num_layers, pool.block_size, k.shape[1], k.shape[2])
    if not isinstance(k, QuantizedKV):
        return BlockLayout(*dims, _WIRE_DTYPES[k.dtype])
    row_bytes = sum(a.shape[-1] * a.itemsize for a in k.arrays())
    quant = f"{pool.kv_layout}/{_WIRE_DTYPES[k.dtype]}/rotated-k"  # (quant.rotate)
    return BlockLayout(*dims, "uint8", quant=quant, row_bytes=row_bytes)


def model_fingerprint(model, layout: BlockLayout) -> str:
    """Names the model and the KV layout: parameter names, shapes, dtypes and a sample of
    each parameter's values, the quantization, and a tensor-parallel rank's shard ("rank 1
    of 2", set by worker.tp.runner.shard: its KV heads are its own); K/V saved under one
    fingerprint never load under another."""
    from mlx.utils import tree_flatten

    shard = getattr(model, "tp_shard", "")  # absent: unsharded, the fingerprint as it was
    digest = hashlib.sha256((repr(layout) + layout.quant + shard).encode())
    for name, param in sorted(tree_flatten(model.parameters()), key=lambda item: item[0]):
        sample = param.reshape(-1)[:64]
        if sample.dtype == mx.bfloat16:
            sample = sample.astype(mx.float32)
        digest.update(f"{name}{param.shape}{param.dtype}".encode())
        digest.update(np.array(sample).tobytes())
    return digest.hexdigest()[:24]


def read_blocks(pool: BlockPool, block_ids: list[int]) -> list[np.ndarray]:
    """Host copies of the blocks' K/V, one payload per block. Each layer is read through
    numpy's view of the evaluated pool array (one gather, no MLX graph: 7x faster than MLX's
    gather and stack on this CPU, for a peer's 64-block fetch 0.07 s instead of 0.5 s)."""
    bs = pool.block_size
    slots = (np.asarray(block_ids, np.int64)[:, None] * bs + np.arange(bs)).reshape(-1)
    parts = [_row_bytes(layer, slots) for layer in (*pool.k, *pool.v)]
    host = np.stack(parts).reshape(2, pool.num_layers, len(block_ids), bs, *parts[0].shape[-2:])
    return [host[:, :, i] for i in range(len(block_ids))]


def write_blocks(pool: BlockPool, block_ids: list[int], payloads: list[np.ndarray]) -> None:
    """Write the payloads into `block_ids` (allocated, held by the caller) with one scatter
    per layer, K and V (each layer's rows made contiguous on the host first)."""
    bs = pool.block_size
    slots = mx.array([b * bs + o for b in block_ids for o in range(bs)], dtype=mx.int32)
    stacked = np.stack(payloads, axis=2)  # (2, L, n, bs, H, D)
    rows = stacked.reshape(2, pool.num_layers, len(block_ids) * bs, *stacked.shape[-2:])
    as_bf16 = pool.k[0].dtype == mx.bfloat16 and pool.kv_bits is None
    for layer in range(pool.num_layers):
        for i, arrays in enumerate((pool.k[layer], pool.v[layer])):
            data = mx.array(rows[i, layer])
            _store(arrays, slots, data.view(mx.bfloat16) if as_bf16 else data)
    mx.eval(pool.k + pool.v)


def _row_bytes(pool, slots: np.ndarray) -> np.ndarray:
    """A pool's `slots` as stored, on the host: the values (bfloat16 as its 16-bit words), or
    a quantized pool's rows of bytes (packed values, scales, biases side by side)."""
    if not isinstance(pool, QuantizedKV):
        return _host(pool)[slots]
    return np.concatenate([_host(a)[slots].view(np.uint8) for a in pool.arrays()], axis=-1)


def _host(array: mx.array) -> np.ndarray:
    """numpy's view of an MLX array (evaluating it first: a step in flight finishes)."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return np.asarray(array)


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
