"""Sizing the block pool: bytes per block, blocks for a budget, device memory."""

from __future__ import annotations

import os

import mlx.core as mx

from worker.kv.quant import bytes_per_value


def bytes_per_block(
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: mx.Dtype,
    kv_bits: int | None = None,
    kv_group_size: int | None = None,
) -> int:
    """Bytes one block takes: K and V, in every layer; quantized (`kv_bits` 8 or 4), the
    packed values plus each group's scale and bias in `dtype`."""
    per_value = bytes_per_value(dtype, kv_bits, kv_group_size)
    return round(2 * num_layers * block_size * num_kv_heads * head_dim * per_value)


def num_blocks_for_budget(
    budget_bytes: int,
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: mx.Dtype,
    kv_bits: int | None = None,
    kv_group_size: int | None = None,
) -> int:
    """How many whole blocks fit in `budget_bytes` (may be 0)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    shape = (block_size, num_layers, num_kv_heads, head_dim, dtype)
    return budget_bytes // bytes_per_block(*shape, kv_bits, kv_group_size)


def device_memory_bytes() -> int:
    """Memory of the device MLX computes on: the GPU's on Metal, else the system's."""
    if mx.metal.is_available():
        device_info = getattr(mx, "device_info", None) or mx.metal.device_info
        return int(device_info()["memory_size"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget_bytes(fraction: float) -> int:
    """`fraction` (0 < fraction <= 1) of the device's memory, in bytes."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
    return int(device_memory_bytes() * fraction)
