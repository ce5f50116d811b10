"""A prompt's images inside the engine: where their tokens are, and their embeddings,
computed once when a prefill chunk first needs them (a prompt whose image is already in the
prefix cache never runs the vision tower) and kept until the prompt is computed; and, for
M-RoPE families (Qwen-VL), every token's 3-D rope positions (worker/vision/mrope.py)."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from shared.models.vision import image_positions

if TYPE_CHECKING:
    from worker.vision.encoder import PreparedImages, VisionEncoder


class PromptImages:
    def __init__(self, token_ids: list[int], prepared: PreparedImages, encoder: VisionEncoder):
        self.token_ids = list(token_ids)
        self.positions = image_positions(token_ids)  # of the image keys, ascending
        self.pixels, self.encoder = prepared.pixels, encoder
        self._embeddings: mx.array | None = None
        self.encodings = 0  # times the vision tower ran for this prompt
        # M-RoPE: the prompt's positions (3, prompt length) and the delta of those after it
        self.rope = prepared.rope

    def rope_positions(self, start: int, length: int) -> np.ndarray | None:
        """M-RoPE families: positions (3, length) of tokens `start`.. (the prompt's as
        computed at intake; past it, index + delta); None for 1-D rope families."""
        if self.rope is None:
            return None
        prompt, delta = self.rope
        index = np.arange(start, start + length)
        out = np.repeat((index + delta)[None], 3, axis=0).astype(np.int32)
        inside = index < prompt.shape[1]
        out[:, inside] = prompt[:, index[inside]]
        return out

    def needs_encoding(self, start: int, length: int) -> bool:
        """Whether tokens `start`..`start + length` hold image tokens whose embeddings are
        not computed yet (the vision tower runs for them)."""
        first, end = self._span(start, length)
        return self._embeddings is None and first < end

    def encode(self) -> None:
        """Run the vision tower for the prompt's images now and evaluate it: raises here, for
        this prompt alone, when the tower fails (the engine then fails only its request)."""
        self._embeddings = self.encoder.encode(self.token_ids, self.pixels)
        self.encodings += 1
        mx.eval(self._embeddings)

    def _span(self, start: int, length: int) -> tuple[int, int]:
        return bisect_left(self.positions, start), bisect_left(self.positions, start + length)

    def rows(self, start: int, length: int) -> tuple[list[int], mx.array] | None:
        """For tokens `start`..`start + length`: the columns (from `start`) that are image
        tokens and their embeddings (columns, hidden); None when there are none."""
        first, end = self._span(start, length)
        if first == end:
            return None
        if self._embeddings is None:  # the engine encodes first (`encode`); not if run alone
            self._embeddings = self.encoder.encode(self.token_ids, self.pixels)
            self.encodings += 1
        cols = [p - start for p in self.positions[first:end]]
        embeddings = self._embeddings[first:end]
        if end == len(self.positions):  # the last image token: not needed again (unless
            self._embeddings = None  # the sequence is preempted: then computed again)
        return cols, embeddings
