"""What one recurrent layer sees as its cache during one of our forwards.

mlx-lm's recurrent layers (gated delta nets, Mamba mixers, short convolutions) read and write
an `ArraysCache`: `cache[i]` the i-th state array for the batch (None: start from zeros),
`cache.lengths` each row's real token count when rows are right-padded (the layers then keep
the state where each row's real tokens end, and `make_mask` masks the padding), and
`cache.advance(n)` after the layer. A `StateCache` is that object over the `StatePool`: it
starts as the batch's rows read from their slots, and `write` puts whatever the layer left
back into those slots (neither copies the pool: `worker.state.slot_arrays`). One per layer
and forward (each layer advances its own lengths).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

if TYPE_CHECKING:
    from worker.state.pool import StatePool


class StateCache(ArraysCache):
    """One recurrent layer's states for one forward's rows (an `ArraysCache`: some layers
    write their state back only into one)."""

    def __init__(self, states: StatePool, layer: int, slots: list[int], lengths: list[int] | None):
        self.states, self.layer, self.slots = states, layer, slots
        self.cache: list[mx.array | None] = states.arrays.read(layer, slots)
        self.lengths = None if lengths is None else mx.array(lengths, dtype=mx.int32)
        self.left_padding = None  # our rows are right-padded only

    def __getitem__(self, i: int):
        return self.cache[i]

    def __setitem__(self, i: int, value) -> None:
        self.cache[i] = value

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def state(self):
        return self.cache

    def empty(self) -> bool:
        return False

    def advance(self, n: int) -> None:
        if self.lengths is not None:
            self.lengths = self.lengths - n

    def make_mask(self, n: int) -> mx.array | None:
        """(B, n): True at each row's real tokens (None when no row is padded)."""
        if self.lengths is None:
            return None
        return mx.arange(n)[None] < self.lengths[:, None]

    def write(self) -> list[mx.array]:
        """Mutates the pool: the layer's states after this forward are the rows' slots' now;
        returns them (B, *shape), to be evaluated with the forward."""
        dtypes = [dtype for _, dtype in self.states.shapes[self.layer]]
        values = [v.astype(d) for v, d in zip(self.cache, dtypes, strict=True)]
        self.states.arrays.write(self.layer, self.slots, values)
        return values
