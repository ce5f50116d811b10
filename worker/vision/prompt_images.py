"""A prompt's images inside the engine: where their tokens are, and their embeddings,
computed once when a prefill chunk first needs them (a prompt whose image is already in the
prefix cache never runs the vision tower) and kept until the prompt is computed."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

import mlx.core as mx

from shared.models.vision import image_positions

if TYPE_CHECKING:
    from worker.vision.encoder import Pixels, VisionEncoder


class PromptImages:
    def __init__(self, token_ids: list[int], pixels: Pixels, encoder: VisionEncoder):
        self.token_ids = list(token_ids)
        self.positions = image_positions(token_ids)  # of the image keys, ascending
        self.pixels, self.encoder = pixels, encoder
        self._embeddings: mx.array | None = None
        self.encodings = 0  # times the vision tower ran for this prompt

    def rows(self, start: int, length: int) -> tuple[list[int], mx.array] | None:
        """For tokens `start`..`start + length`: the columns (from `start`) that are image
        tokens and their embeddings (columns, hidden); None when there are none."""
        first = bisect_left(self.positions, start)
        end = bisect_left(self.positions, start + length)
        if first == end:
            return None
        if self._embeddings is None:
            self._embeddings = self.encoder.encode(self.token_ids, self.pixels)
            self.encodings += 1
        cols = [p - start for p in self.positions[first:end]]
        embeddings = self._embeddings[first:end]
        if end == len(self.positions):  # the last image token: not needed again (unless
            self._embeddings = None  # the sequence is preempted: then computed again)
        return cols, embeddings
