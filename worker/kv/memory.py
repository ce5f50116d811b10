"""Sizing the block pool: bytes per block, blocks for a budget, device memory; the worker's
memory budget, its split, MLX's limits, and telling an allocation failure apart."""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    shapes = [(num_kv_heads, head_dim, num_kv_heads, head_dim)] * num_layers
    return layers_bytes_per_block(block_size, shapes, dtype, kv_bits, kv_group_size)


def layers_bytes_per_block(
    block_size: int,
    layer_shapes: list[tuple[int, int, int, int]],
    dtype: mx.Dtype,
    kv_bits: int | None = None,
    kv_group_size: int | None = None,
) -> int:
    """Bytes one block takes over layers of their own shapes, (K heads, K width, V heads,
    V width) each (MLA's latent and rope parts; two head dims)."""
    per_value = bytes_per_value(dtype, kv_bits, kv_group_size)
    values = sum(kh * kd + vh * vd for kh, kd, vh, vd in layer_shapes)
    return round(block_size * values * per_value)


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


# ---- the worker's memory budget: weights + KV pool + the largest step's activations ----

CPU_BUDGET_FRACTION = 0.75  # without Metal: this share of RAM (the OS and others keep the rest)
ACTIVATION_SHARE = 0.25  # at most this share of (budget - weights) goes to one step's activations
OUT_OF_MEMORY = "the worker ran out of memory for this step"  # the error's start (router)
_OOM_MARKERS = ("[metal::malloc]", "[malloc]", "unable to allocate", "attempting to allocate")
_OOM_MARKERS += ("insufficient memory", "out of memory")


class MemoryBudgetTooSmall(ValueError):
    """The budget does not hold the model's weights and one step."""


@dataclass(frozen=True)
class MemoryPlan:
    budget: int  # bytes this worker may use
    weights: int
    kv: int  # the KV pool's share
    activations: int  # one step of `step_tokens` tokens, estimated
    step_tokens: int  # the step token budget (and the largest prefill chunk) it fits
    kept_prefixes: int = 0  # attention's gathered prefix K/V kept across ticks, at most

    def describe(self) -> str:
        gib = 2**30
        return (
            f"memory budget {self.budget / gib:.2f} GiB: weights {self.weights / gib:.2f}, "
            f"KV pool {self.kv / gib:.2f}, activations of a {self.step_tokens}-token step "
            f"{self.activations / gib:.2f} (estimated), kept prefixes "
            f"{self.kept_prefixes / gib:.2f}, free {self.free / gib:.2f}"
        )

    @property
    def free(self) -> int:
        return self.budget - self.weights - self.kv - self.activations - self.kept_prefixes


def default_budget_bytes() -> int:
    """On Metal the recommended working set (the GPU's own limit); else a share of RAM."""
    if mx.metal.is_available():
        device_info = getattr(mx, "device_info", None) or mx.metal.device_info
        info = device_info()
        return int(info.get("max_recommended_working_set_size") or info["memory_size"])
    return int(device_memory_bytes() * CPU_BUDGET_FRACTION)


def activation_bytes_per_token(vocab_size: int, num_heads: int, head_dim: int) -> int:
    """A step's peak working memory per token, estimated: float32 logits over the vocabulary
    (and their log-softmax), plus ~24 hidden-sized float32 intermediates of one layer (norms,
    Q/K/V, attention output, the MLP's gate/up/down at ~4x the hidden size, residuals)."""
    hidden = max(num_heads, 1) * head_dim
    return 4 * (2 * vocab_size + 24 * hidden)


def plan_memory(
    budget: int,
    weights: int,
    kv_wanted: int,
    per_token: int,
    step_tokens: int,
    block_size: int,
    kept_max: int = 0,
) -> MemoryPlan:
    """Split `budget`: weights first; then the activations of a step, at most
    ACTIVATION_SHARE of the rest (a smaller step, in whole blocks, when the configured one
    does not fit); the KV pool gets the rest, up to `kv_wanted`; the kept prefix K/V what is
    left then, up to `kept_max` (none when the pool takes it all)."""
    left = budget - weights
    if left < per_token * block_size:
        raise MemoryBudgetTooSmall(
            f"the memory budget ({budget / 2**30:.2f} GiB) does not hold the model's weights "
            f"({weights / 2**30:.2f} GiB) and one step; raise --memory-budget"
        )
    fits = int(left * ACTIVATION_SHARE) // per_token // block_size * block_size
    step_tokens = max(block_size, min(step_tokens, fits))
    activations = per_token * step_tokens
    kv = max(0, min(kv_wanted, left - activations))
    kept = max(0, min(kept_max, left - activations - kv))
    return MemoryPlan(budget, weights, kv, activations, step_tokens, kept)


def apply_limits(budget: int) -> None:
    """Tell MLX the budget: its memory limit (allocations beyond it wait for freed memory or
    fail) and, on Metal, the wired limit (memory kept resident). Guarded for MLX versions
    that keep these under `mx.metal`."""
    for name in ("set_memory_limit", "set_wired_limit"):
        if name == "set_wired_limit" and not mx.metal.is_available():
            continue
        setter = getattr(mx, name, None) or getattr(mx.metal, name, None)
        if setter is not None:
            setter(budget)


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: Python's MemoryError (the CPU allocator's std::bad_alloc) or
    MLX's RuntimeError ("[metal::malloc] Attempting to allocate ... bytes", "Unable to
    allocate", a command buffer's "Insufficient Memory")."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MARKERS)


def clear_cache() -> None:
    (getattr(mx, "clear_cache", None) or mx.metal.clear_cache)()
