"""Batches of inputs through a trunk, pooled: the worker's whole embedding computation.

Inputs are sorted by length and cut into batches of at most `max_batch_tokens` padded
tokens, so a short input never waits behind a long one's padding."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from shared.models.embedding import EmbeddingSpec
from worker.embed.pooling import pool
from worker.embed.trunk import Trunk

DEFAULT_MAX_BATCH_TOKENS = 8192  # padded tokens in one forward
MAX_BATCH_ROWS = 64
# a batch closes before its padded tokens pass this multiple of its real ones: padding is
# computed like real tokens (64 inputs of 8..128 tokens in one forward: 1.85x the work)
MAX_PADDING_RATIO = 1.25


class Embedder:
    def __init__(
        self, trunk: Trunk, spec: EmbeddingSpec, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    ):
        self.trunk, self.spec, self.max_batch_tokens = trunk, spec, max_batch_tokens

    def vectors(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, H) pooled float32 vectors, not yet normalized (pooling.finish does that)."""
        if any(len(ids) == 0 for ids in inputs):
            raise ValueError("an input has no tokens")
        out = np.zeros((len(inputs), self.spec.dimensions), dtype=np.float32)
        for rows in self.batches(inputs):
            out[rows] = np.asarray(self._forward([inputs[i] for i in rows]))
        return out

    def batches(self, inputs: Sequence[Sequence[int]]) -> list[list[int]]:
        """Input indices, shortest first, in batches whose padded size fits the budget and
        wastes at most MAX_PADDING_RATIO on padding."""
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        batches: list[list[int]] = []
        real = 0  # tokens of the last batch's inputs
        for i in order:
            n, batch = len(inputs[i]), batches[-1] if batches else []
            padded = (len(batch) + 1) * n  # sorted: this input is the longest so far
            fits = padded <= self.max_batch_tokens and padded <= MAX_PADDING_RATIO * (real + n)
            if batch and len(batch) < MAX_BATCH_ROWS and fits:
                batch.append(i)
                real += n
            else:
                batches.append([i])
                real = n
        return batches

    def _forward(self, rows: list[Sequence[int]]) -> mx.array:
        width = max(len(ids) for ids in rows)
        ids = np.zeros((len(rows), width), dtype=np.int32)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = row
        lengths = mx.array([len(row) for row in rows], dtype=mx.int32)
        mask = mx.arange(width)[None, :] < lengths[:, None]
        vectors = pool(self.trunk(mx.array(ids), mask), lengths, self.spec.pooling)
        mx.eval(vectors)
        return vectors
