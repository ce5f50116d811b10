"""Where the state pool's states live: one `mx.array` per slot and state array, never one
array of every slot.

A pool of `(num_slots, *shape)` arrays that a forward gathers its rows from and scatters them
back into, in one graph, copies the whole pool every step: MLX writes a scatter in place only
when nothing else still reads its input when it is dispatched, and the gather that feeds the
forward does (a `(64, 8, 64, 64)` float32 array rose the peak by the whole 8 MiB per write on
this machine, where a scatter alone rose it by nothing). So a slot holds its own arrays:

- a forward **reads** its rows stacked (`read`: the B rows copied, as a gather did), or, when
  its rows are those the previous forward of the layer wrote, in the same order (a steady
  decode), that forward's output itself: nothing copied;
- it **writes** each row as a view of its output (`write`: nothing copied; the output's buffer
  lives while a slot still holds one of its rows, so until the rows' next forward, mostly);
- snapshots and kept copies are `mx.contiguous` copies of one slot (their own buffer: they
  outlive the batch's; evaluated with the next forward, `take_copies`, so that none holds a
  batch's buffer longer), and starting a sequence from one, or forking one, shares the arrays
  (MLX arrays are never changed in place while shared). A slot of zeros holds nothing.
"""

from __future__ import annotations

import mlx.core as mx

# one recurrent layer's arrays: (per-sequence shape, dtype) of each
StateShape = tuple[tuple[tuple[int, ...], mx.Dtype], ...]


class SlotArrays:
    """Each slot's arrays of every recurrent layer; None: zeros."""

    def __init__(self, shapes: list[StateShape], num_slots: int):
        self._zeros = [[mx.zeros(shape, dtype=dtype) for shape, dtype in layer] for layer in shapes]
        self._slots: list[list[mx.array] | None] = [None] * num_slots  # per slot, layer-major
        self._sizes = [len(layer) for layer in shapes]
        # per layer: the rows its latest forward wrote, and that forward's outputs
        self._batch: list[tuple[tuple[int, ...], list[mx.array]] | None] = [None] * len(shapes)
        self._copies: list[mx.array] = []  # copies not evaluated yet

    def read(self, layer: int, slots: list[int]) -> list[mx.array]:
        """The rows' states of `layer` (B, *shape), one array per state."""
        batch = self._batch[layer]
        if batch is not None and batch[0] == tuple(slots):
            return list(batch[1])
        return [
            mx.stack([self._get(s, layer, i) for s in slots]) for i in range(self._sizes[layer])
        ]

    def write(self, layer: int, slots: list[int], values: list[mx.array]) -> None:
        """Mutates: row b of each of `values` (B, *shape) is slot `slots[b]`'s state now."""
        at = sum(self._sizes[:layer])
        for b, s in enumerate(slots):
            arrays = self._own(s)
            for i, value in enumerate(values):
                arrays[at + i] = value[b]
        self._batch[layer] = (tuple(slots), list(values))

    def zero(self, slot: int) -> None:
        """Mutates: `slot` holds zeros (and lets its arrays go)."""
        self._set(slot, None)

    def copy(self, src: int, dst: int) -> None:
        """Mutates: `dst` holds a copy of `src` in buffers of its own."""
        arrays = self._slots[src]
        copies = None if arrays is None else [mx.contiguous(a) for a in arrays]
        self._copies += copies or []
        self._set(dst, copies)

    def take_copies(self) -> list[mx.array]:
        """Mutates: the copies made since the last call, for the next forward to evaluate."""
        copies, self._copies = self._copies, []
        return copies

    def share(self, src: int, dst: int) -> None:
        """Mutates: `dst` holds `src`'s states (the same arrays: nothing copied)."""
        arrays = self._slots[src]
        self._set(dst, None if arrays is None else list(arrays))

    def _get(self, slot: int, layer: int, i: int) -> mx.array:
        arrays = self._slots[slot]
        return self._zeros[layer][i] if arrays is None else arrays[sum(self._sizes[:layer]) + i]

    def _own(self, slot: int) -> list[mx.array]:
        if self._slots[slot] is None:
            self._slots[slot] = [a for layer in self._zeros for a in layer]
        return self._slots[slot]

    def _set(self, slot: int, arrays: list[mx.array] | None) -> None:
        self._slots[slot] = arrays
        # a forward's outputs stand for its rows only while no row was set otherwise
        self._batch = [b if b is None or slot not in b[0] else None for b in self._batch]
