"""The state pool's storage (`worker.state.slot_arrays`): what a forward reads is what the
previous one wrote for those slots, in any order; copies and shares stay apart from later
writes; and a pool of 64 slots is never copied by a write (MLX's peak memory, not time)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from worker.state.slot_arrays import SlotArrays

SHAPES = [(((3, 4), mx.float32), ((2,), mx.float32))]  # one layer, two state arrays


def _rows(*values: float) -> list[mx.array]:
    return [mx.stack([mx.full(shape, v) for v in values]) for shape, _ in SHAPES[0]]


def _read(arrays: SlotArrays, slots: list[int]) -> list[float]:
    states = arrays.read(0, slots)
    mx.eval(states)
    return [float(np.array(states[0])[b].mean()) for b in range(len(slots))]


def test_reads_return_what_was_written_in_any_order():
    arrays = SlotArrays(SHAPES, 8)
    assert _read(arrays, [3, 5]) == [0.0, 0.0]  # fresh slots hold zeros
    arrays.write(0, [3, 5], _rows(1.0, 2.0))
    assert _read(arrays, [3, 5]) == [1.0, 2.0]  # the previous forward's output itself
    assert _read(arrays, [5, 3, 6]) == [2.0, 1.0, 0.0]
    arrays.write(0, [5, 6], _rows(7.0, 8.0))
    assert _read(arrays, [3, 5, 6]) == [1.0, 7.0, 8.0]


def test_copies_and_shares_keep_their_states_when_the_source_moves_on():
    arrays = SlotArrays(SHAPES, 8)
    arrays.write(0, [1, 2], _rows(1.0, 2.0))
    arrays.copy(1, 6)  # a snapshot
    arrays.share(2, 7)  # a fork
    mx.eval(arrays.take_copies())
    arrays.write(0, [1, 2], _rows(3.0, 4.0))
    assert _read(arrays, [6, 7, 1, 2]) == [1.0, 2.0, 3.0, 4.0]
    arrays.zero(6)
    arrays.write(0, [7], _rows(9.0))
    assert _read(arrays, [6, 7, 2]) == [0.0, 9.0, 4.0]
    assert arrays.take_copies() == []


def test_writing_64_slots_never_copies_them():
    shapes = [(((8, 64, 64), mx.float32),)] * 4  # 8 MiB per layer at 64 slots
    arrays = SlotArrays(shapes, 64)
    slots = list(range(8))
    for layer in range(4):  # every slot written once: no zeros left to allocate
        for first in range(0, 64, 8):
            arrays.write(layer, [first + s for s in slots], [mx.ones((8, 8, 64, 64))])
    for step in range(3):  # a decode step: read the rows, update them, write them back
        mx.eval([arrays.read(layer, slots) for layer in range(4)])
        mx.reset_peak_memory()
        live = mx.get_active_memory()
        new = [arrays.read(layer, slots)[0] * 1.5 for layer in range(4)]
        for layer, value in enumerate(new):
            arrays.write(layer, slots, [value])
        mx.eval(new)
        # the rows (4 x 1 MiB) and temporaries at most; a pool copy would be 8 MiB a layer
        assert mx.get_peak_memory() - live < 8 * 2**20, step
