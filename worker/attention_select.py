"""Choose a worker's paged-attention backend once, at start, and say why.

"mlx" (MLX ops) runs everywhere and is the reference. "metal" (the kernel) is used only where
Metal is available and a self-test on this machine passes: it must match the reference on
random inputs and be faster on a representative decode shape. `--attention-backend` overrides
("metal" where the kernel can't run is an error at start, not a silent fallback).
"""

from __future__ import annotations

import logging

from shared.protocol import AttentionReport
from worker.paged_attention import BACKENDS, AttentionBackend, resolve_backend

log = logging.getLogger(__name__)


def select_backend(
    requested: str, shape, block_size: int
) -> tuple[AttentionBackend, AttentionReport]:
    """The backend this worker's forwards use, and the report it registers with."""
    if requested == "mlx":
        return BACKENDS["mlx"], AttentionReport("mlx", requested, "not run: mlx requested")
    backend = resolve_backend(requested)  # raises on unknown names or an unavailable "metal"
    if backend.name == "mlx":
        reason = BACKENDS["metal"].unavailable_reason()
        log.info("paged attention: MLX ops (%s)", reason)
        return backend, AttentionReport("mlx", requested, f"not run: {reason}")
    return backend, AttentionReport(backend.name, requested, "not run")
