"""Choose a worker's paged-attention backend once, at start, and say why.

"mlx" (MLX ops) runs everywhere and is the reference. With "auto", the Metal kernel is used
only where Metal is available and its self-test on this machine passes
(`worker.attention.selftest`): it must match the reference on random inputs and be faster on a
representative decode shape; then every pipeline the worker will use is compiled up front
(`prewarm`), so no request pays for it. Otherwise MLX ops, and the report says why. With the
kernel chosen, its split-K and prefix-grouped variants are self-tested too, each on the shape
it is for, and kept only where they match and beat the plain kernel (`metal_plan.VERDICTS`);
so are its sliding-window and sink variants, which must match: a window or sinks whose
variant did not pass is served by the MLX-ops reference for those calls (`paged._metal_checked`).
`--attention-backend metal` insists on the kernel: a kernel that is only slower is used, but
one that is missing, fails or gives wrong numbers stops the worker with the reason.
"""

from __future__ import annotations

import dataclasses
import logging

import mlx.core as mx

import worker.attention.selftest as selftest
from shared.config.choices import ATTENTION_BACKENDS
from shared.protocol import AttentionReport
from worker.attention.metal import kernel as metal_kernel
from worker.attention.paged import BACKENDS, AttentionBackend, BackendUnavailableError

log = logging.getLogger(__name__)


def select_backend(
    requested: str, shape, block_size: int, pool=None
) -> tuple[AttentionBackend, AttentionReport]:
    """The backend this worker's forwards use, and the report it registers with (with the
    `pool`'s KV layout and bytes per token). Quantized K/V (`pool.kv_bits` 8 or 4): the
    self-test and pre-warm run the kernel's quantized variant on pools of the same layout."""
    backend, report = _select(requested, shape, block_size, _quantizer(pool))
    if pool is None:
        return backend, report
    kv = dict(kv_layout=pool.kv_layout, kv_bytes_per_token=pool.bytes_per_token)
    return backend, dataclasses.replace(report, **kv)


def _quantizer(pool) -> selftest.Quantizer | None:
    """Plain pool -> the same values in `pool`'s quantized layout, through the pool's own
    quantized K/V type (`worker.kv.quant`, a sibling layer this one does not import)."""
    if getattr(pool, "kv_bits", None) is None:
        return None
    layer_type, bits, group_size = type(pool.k[0]), pool.kv_bits, pool.kv_group_size

    def quantize(values: mx.array):
        out = layer_type.zeros(*values.shape, bits=bits, group_size=group_size, dtype=values.dtype)
        out[mx.arange(values.shape[0])] = values
        return out

    return quantize


def _select(requested: str, shape, block_size: int, quantize):
    if requested not in ATTENTION_BACKENDS:
        known = ", ".join(ATTENTION_BACKENDS)
        raise ValueError(f"unknown paged-attention backend {requested!r}; known: {known}")
    if requested == "mlx":
        return BACKENDS["mlx"], AttentionReport("mlx", requested, "not run: mlx requested")
    missing = metal_kernel.metal_reason()
    if missing is not None:
        if requested == "metal":
            raise BackendUnavailableError(f"--attention-backend metal: {missing}")
        log.info("paged attention: MLX ops (%s)", missing)
        return BACKENDS["mlx"], AttentionReport("mlx", requested, f"not run: {missing}")
    return _self_tested(requested, shape, block_size, quantize)


def _self_tested(requested: str, shape, block_size: int, quantize):
    dims = dict(
        num_heads=shape.num_heads or shape.num_kv_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        quantize=quantize,
    )
    result = selftest.verify_metal_backend(block_size=block_size, dtype=shape.kv_dtype, **dims)
    slower_only = result.reason.startswith("slower")
    if result.ok or (requested == "metal" and slower_only):
        warm = selftest.prewarm(BACKENDS["metal"].run, [block_size], [shape.kv_dtype], **dims)
        failed = [f"{key}: {why}" for key, why in warm.items() if why is not None]
        if not failed:
            log.info("paged attention: the Metal kernel (%s)", result.reason)
            _self_test_variants(block_size, shape.kv_dtype, dims)
            return BACKENDS["metal"], _report("metal", requested, "passed", result)
        result = result._replace(ok=False, reason=f"pre-warm failed: {'; '.join(failed)}")
    if requested == "metal":
        raise BackendUnavailableError(f"--attention-backend metal: self-test {result.reason}")
    log.warning("paged attention: MLX ops; the Metal kernel's self-test: %s", result.reason)
    return BACKENDS["mlx"], _report("mlx", requested, f"failed: {result.reason}", result)


def _self_test_variants(block_size: int, dtype, dims: dict) -> None:
    """Split-K and prefix-grouped: each used only after it matched the reference and beat the
    plain kernel on its own shape here (`selftest.verify_metal_variants`); else the plain
    kernel serves those batches."""
    for variant, result in selftest.verify_metal_variants(
        block_size=block_size, dtype=dtype, **dims
    ).items():
        state = "on" if result.ok else "off"
        log.info("paged attention: Metal %s variant %s (%s)", variant, state, result.reason)


def _report(backend: str, requested: str, verdict: str, result) -> AttentionReport:
    return AttentionReport(
        backend,
        requested,
        verdict if verdict != "passed" else f"passed: {result.reason}",
        result.candidate_ms,
        result.reference_ms,
    )
