"""Seam for the Metal paged-attention kernel (a separate issue): no kernel here yet.

The kernel will read each block as one contiguous `block_size x num_kv_heads x head_dim` tile
of the slot pools and walk the block table (`mx.fast.metal_kernel`). Until it lands, this
backend reports itself unavailable, so `backend="auto"` picks "mlx" everywhere and
`backend="metal"` raises `BackendUnavailableError` naming the reason. To plug the kernel in:
implement `paged_attention_metal` and make `unavailable_reason` return None where it can run
(Metal present); `worker.paged_attention` needs no change.
"""

from __future__ import annotations

import mlx.core as mx


def unavailable_reason() -> str | None:
    """Why the Metal backend can't run here, or None when it can."""
    if not mx.metal.is_available():
        return "Metal is not available on this machine (mx.metal.is_available() is False)"
    return "the Metal paged-attention kernel is not implemented yet (only its seam exists)"


def paged_attention_metal(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    max_context: int,
) -> mx.array:
    """The kernel's entry point; same contract as the "mlx" strategies."""
    raise NotImplementedError(unavailable_reason())
