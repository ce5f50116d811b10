"""The state pool: what a hybrid model's recurrent layers keep per sequence, in slots.

A recurrent layer (mlx-lm's `ArraysCache`: a convolution's last inputs, a linear-attention or
state-space matrix) keeps a fixed-size state per sequence instead of a K/V that grows. A
running sequence owns one slot, which holds its states of every recurrent layer
(`worker.state.slot_arrays`: one array per slot, so that writing them back never copies the
pool); a forward reads the rows' slots and writes them back (`worker.runner.state_cache`).

Snapshots make prefix caching possible: a copy of a sequence's states taken where its
computed tokens end on a block boundary, keyed by the chained hash of the block that ends
there (the same hash the radix tree and the router know the block by), so a later prompt that
shares the prefix up to that block starts from the snapshot instead of from nothing. Slots are
one free list for both: a running sequence takes the free slot or, failing that, the least
recently used snapshot; a snapshot is taken only into a free slot beyond the slots kept for
running sequences (`reserved`), so snapshots never starve running work. States are large (tens
of MiB per sequence for big hybrids): snapshots are few, counted, and evicted LRU.

A running sequence may also keep one private copy (`keep`): its states at the latest block
boundary its decode crossed, overwritten at the next one, and published as a snapshot when it
ends (`publish`), so the next turn of a chat starts after the reply. It takes a spare slot
like a snapshot does, and is nobody else's until published.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable

from worker.state.slot_arrays import SlotArrays, StateShape


def state_bytes(shapes: Iterable[StateShape]) -> int:
    """One sequence's states in every recurrent layer of `shapes`, in bytes."""
    return sum(dtype.size * math.prod(shape) for layer in shapes for shape, dtype in layer)


class StatePool:
    """Slots of every recurrent layer's state arrays, and the snapshots among them."""

    def __init__(self, shapes: list[StateShape], num_slots: int, reserved: int):
        if num_slots < reserved or reserved < 1:
            raise ValueError(f"{num_slots} state slots cannot keep {reserved} for running work")
        self.shapes, self.num_slots, self.reserved = list(shapes), num_slots, reserved
        self.arrays = SlotArrays(self.shapes, num_slots)
        self._free = list(range(num_slots - 1, -1, -1))
        self._running: set[int] = set()
        self._kept: set[int] = set()  # running sequences' private copies (`keep`)
        self.snapshots: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, LRU first
        self.on_drop: Callable[[list[int]], None] | None = None  # hashes of dropped snapshots
        self.snapshots_taken = self.snapshot_hits = 0  # cumulative

    @property
    def bytes_per_slot(self) -> int:
        return state_bytes(self.shapes)

    @property
    def kept(self) -> int:
        """Slots holding running sequences' copies of their states (`keep`)."""
        return len(self._kept)

    @property
    def snapshot_bytes(self) -> int:
        return len(self.snapshots) * self.bytes_per_slot

    def room(self) -> int:
        """Slots a running sequence could take now (free or held by a snapshot)."""
        return len(self._free) + len(self.snapshots)

    # ---- running sequences ----

    def allocate(self) -> int:
        """Mutates: a slot of zeros for a new sequence; the LRU snapshot goes if none is free.
        Raises RuntimeError when every slot runs a sequence (check `room()` first)."""
        slot = self._take()
        self.arrays.zero(slot)
        return slot

    def fork(self, slot: int) -> int:
        """Mutates: a new running slot holding a copy of `slot`'s states (an n > 1 choice)."""
        child = self._take()
        self.arrays.share(slot, child)
        return child

    def free(self, slot: int) -> None:
        """Mutates: a running sequence gives its slot back."""
        self._running.remove(slot)
        self._free.append(slot)
        self.arrays.zero(slot)

    # ---- snapshots ----

    def snapshot(self, slot: int, block_hash: int) -> bool:
        """Mutates: keep a copy of running `slot`'s states as the state after the block
        `block_hash`; False (nothing kept) when no slot is spare beyond the reserved ones."""
        if block_hash in self.snapshots:
            self.snapshots.move_to_end(block_hash)
            return True
        target = self._spare()
        if target is None:
            return False
        self.arrays.copy(slot, target)
        self.snapshots[block_hash] = target
        self.snapshots_taken += 1
        return True

    def deepest(self, block_hashes: list[int]) -> int:
        """How many of `block_hashes` (a prefix's chain, in order) lead up to the deepest one
        with a snapshot (0: none)."""
        for i in range(len(block_hashes), 0, -1):
            if block_hashes[i - 1] in self.snapshots:
                return i
        return 0

    def restore(self, block_hash: int) -> int:
        """Mutates: a new running slot starting from the snapshot after `block_hash`."""
        source = self.snapshots[block_hash]
        self.snapshots.move_to_end(block_hash)
        self.snapshot_hits += 1
        slot = self._take(keep=source)
        self.arrays.share(source, slot)
        return slot

    def forget(self, block_hashes: Iterable[int]) -> None:
        """Mutates: the blocks left the prefix cache; their snapshots go with them."""
        self._drop([h for h in block_hashes if h in self.snapshots])

    def clear(self) -> None:
        self._drop(list(self.snapshots))

    # ---- a running sequence's private copy ----

    def keep(self, slot: int, kept: int | None) -> int | None:
        """Mutates: a copy of running `slot`'s states into `kept` (the sequence's previous
        copy, overwritten) or, with None, a spare slot; the slot kept, or None when no slot
        is spare beyond the reserved ones."""
        if kept is None:
            kept = self._spare()
            if kept is None:
                return None
            self._kept.add(kept)
        self.arrays.copy(slot, kept)
        return kept

    def publish(self, kept: int, block_hash: int) -> bool:
        """Mutates: the copy `kept` becomes the snapshot after `block_hash`; False when that
        snapshot existed already (the copy is freed)."""
        self._kept.remove(kept)
        if block_hash in self.snapshots:
            self.snapshots.move_to_end(block_hash)
            self._free.append(kept)
            self.arrays.zero(kept)
            return False
        self.snapshots[block_hash] = kept
        self.snapshots_taken += 1
        return True

    def discard(self, kept: int) -> None:
        """Mutates: a copy nobody will publish is freed."""
        self._kept.remove(kept)
        self._free.append(kept)
        self.arrays.zero(kept)

    # ---- internals ----

    def _spare(self) -> int | None:
        """Mutates: a free slot beyond those kept for running sequences (the LRU snapshot
        dropped if it takes that), None when there is none."""
        if len(self._free) - max(0, self.reserved - len(self._running)) <= 0:
            if not self.snapshots:
                return None
            self._drop([next(iter(self.snapshots))])
        return self._free.pop()

    def _take(self, keep: int | None = None) -> int:
        if not self._free:
            victim = next((h for h, s in self.snapshots.items() if s != keep), None)
            if victim is None:
                raise RuntimeError("no state slot left for a running sequence")
            self._drop([victim])
        slot = self._free.pop()
        self._running.add(slot)
        return slot

    def _drop(self, hashes: list[int]) -> None:
        for h in hashes:
            slot = self.snapshots.pop(h)
            self._free.append(slot)
            self.arrays.zero(slot)
        if hashes and self.on_drop is not None:
            self.on_drop(hashes)

    def check(self) -> None:
        """Raise AssertionError unless every slot is exactly one of free, running, kept, snapshot."""
        kinds = [*self._free, *self._running, *self._kept, *self.snapshots.values()]
        assert sorted(kinds) == list(range(self.num_slots)), "state slots double-booked or lost"
