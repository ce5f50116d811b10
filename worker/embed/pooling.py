"""From a batch's final hidden states to one vector per input, and the vector's last touches.

Rows are right-padded. A decoder's attention is causal, so the padding after a row's last
token never reaches its real tokens: padded and alone give the same states. An encoder's
padding is masked out of its attention (the trunk's mask)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

NORM_FLOOR = 1e-12  # a zero vector stays zero rather than dividing by zero


def pool(hidden: mx.array, lengths: mx.array, pooling: str) -> mx.array:
    """(B, T, H) states and (B,) real lengths -> (B, H) float32 vectors."""
    hidden = hidden.astype(mx.float32)
    if pooling == "last":
        return hidden[mx.arange(hidden.shape[0]), lengths - 1]
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = (mx.arange(hidden.shape[1])[None, :] < lengths[:, None]).astype(mx.float32)
        return (hidden * mask[..., None]).sum(axis=1) / lengths[:, None].astype(mx.float32)
    raise ValueError(f"unknown pooling {pooling!r}")


def finish(vectors: np.ndarray, normalize: bool, dimensions: int = 0) -> np.ndarray:
    """Truncate to `dimensions` (0: keep all; Matryoshka), then L2-normalize when the model
    normalizes or when it was truncated (a prefix of a unit vector is not one)."""
    if dimensions:
        vectors = vectors[:, :dimensions]
    if normalize or dimensions:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, NORM_FLOOR)
    return np.ascontiguousarray(vectors, dtype="<f4")
