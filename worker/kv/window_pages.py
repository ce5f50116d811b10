"""Pages for sliding-window layers: storage a block needs only while some query can see it.

Blocks (`BlockPool`) are the fleet's unit: one block id names 32 tokens, the radix cache and
the KV events speak of them, hashes name them. A sliding-window layer reads only the last W
keys of each row, so its share of a block is dead weight once every query that will run is
past it. So the pool's memory is cut into equal *units* (32 tokens of as many layers as the
model has full-attention layers) drawn from one free list:

- a block's own unit holds its full-attention layers;
- the window layers, in sub-groups of that many layers, hold a block's tokens in *pages*: one
  unit per sub-group, taken when the block is allocated (its tokens are about to be written);
- once every sequence holding a block is past it (no query any of them will run can see it:
  a shared system prompt is released when its last reader moves on), the block's pages become
  *spare*: their content stays, so a later prompt can still hit it, and they are the first
  units taken back when the free list runs dry (least recently spared first); a cached block
  no sequence holds keeps its pages spare; a freed block gives back its unit and its pages.
  `past[block]` counts the holders past it; a holder that lets go of a block it was past (it
  finished, or was preempted) takes itself off the count, and a fork is past what its parent
  is.

Memory follows the load, as vLLM's hybrid allocator does with its per-group block tables over
one page pool: short contexts spend units on pages, long ones on blocks. A prefix hit needs
pages only for the ⌈(W - 1) / block⌉ blocks before the match point (`usable_blocks`); the
blocks before them serve the full-attention layers alone. A ring buffer per sequence would
break prefix caching.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from worker.kv.errors import IntegrityError
from worker.kv.quant import make_pools


class WindowPages:
    """Each block's page in every window sub-group, drawn from the pool's free units."""

    def __init__(
        self,
        groups: int,
        free: deque[int],
        num_units: int,
        window: int,
        block_size: int,
        chunk: int = 0,
        chunked: bool = False,
    ):
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        self.groups, self.window, self.block_size = groups, window, block_size
        self.chunk = chunk  # the engine's prefill chunk: pages a prefill holds at once
        # every page layer is chunked attention, chunks of `window` in whole blocks: released
        # and hit by the chunk rule (worker/engine/caches/chunks.py), not the window's
        self.chunked = chunked
        self._free = free  # the pool's free list of units, shared
        self.page_of = [[-1] * num_units for _ in range(groups)]  # per sub-group: block -> unit
        self.is_page = [False] * num_units
        self.past = [0] * num_units  # per block: how many of its holders are past it
        self._spare: OrderedDict[int, None] = OrderedDict()  # blocks, least recently spared first
        self.units_held = 0  # units holding pages (spare ones included)
        self.released = 0  # blocks whose pages went spare while their sequence ran (cumulative)
        self.reclaimed = 0  # blocks whose spare pages were taken back (cumulative)
        self.on_drop: Callable[[list[int]], None] | None = None  # told of blocks taken back

    @property
    def blocks_before_match(self) -> int:
        """Blocks before a match point whose pages a hit needs: ⌈(W - 1) / block⌉."""
        return -(-(self.window - 1) // self.block_size)

    def units_alone(self, blocks: int) -> int:
        """Units a sequence of `blocks` blocks needs at most, alone, prefilled in `chunk`-token
        chunks: its blocks, and pages for those a window or a chunk can see at once."""
        seen = -(-(self.window + self.chunk) // self.block_size) + 2
        return blocks + self.groups * min(blocks, seen)

    def spare_units(self) -> int:
        return len(self._spare) * self.groups

    def kept_units(self, block_ids) -> int:
        """Units the pages of `block_ids` hold and do not offer as spare (a partial tail's, kept
        live for the next prompt to copy)."""
        return self.groups * sum(1 for b in block_ids if self.has_page(b) and b not in self._spare)

    def has_page(self, block_id: int) -> bool:
        return self.page_of[0][block_id] >= 0

    def pages(self, block_id: int) -> list[int]:
        return [group[block_id] for group in self.page_of]

    def make_free(self, units: int) -> None:
        """Mutates: take spare pages back until the free list holds `units` (or none is left);
        `on_drop` hears which blocks lost theirs."""
        dropped = []
        while len(self._free) < units and self._spare:
            block, _ = self._spare.popitem(last=False)
            self.take_back(block)
            dropped.append(block)
        self.reclaimed += len(dropped)
        if dropped and self.on_drop is not None:
            self.on_drop(dropped)

    def give(self, block_id: int) -> None:
        """Mutates: pages for a block just allocated, from the free list (`make_free` first)."""
        for group in self.page_of:
            unit = self._free.popleft()
            group[block_id], self.is_page[unit] = unit, True
        self.units_held += self.groups

    def take_back(self, block_id: int) -> None:
        """Mutates: a block's pages go back to the free list."""
        if self.page_of[0][block_id] < 0:
            return
        self._spare.pop(block_id, None)
        for group in self.page_of:
            unit, group[block_id] = group[block_id], -1
            self.is_page[unit] = False
            self._free.append(unit)
        self.units_held -= self.groups

    def spare(self, block_id: int, released: bool = False) -> None:
        """Mutates: the pages of `block_id` may be taken back (content kept until then)."""
        if self.page_of[0][block_id] >= 0 and block_id not in self._spare:
            self._spare[block_id] = None
            self.released += released

    def unspare(self, block_id: int) -> None:
        """Mutates: `block_id` is read through a window again; its pages are not to be taken."""
        self._spare.pop(block_id, None)

    def usable_blocks(self, block_ids: Sequence[int]) -> int:
        """How many leading blocks of a prefix match a hit can use: the most m whose
        `blocks_before_match` blocks before m all still have their pages."""
        need = self.blocks_before_match
        for m in range(len(block_ids), 0, -1):
            if all(self.page_of[0][b] >= 0 for b in block_ids[max(0, m - need) : m]):
                return m
        return 0

    def out_of_window(self, num_computed: int) -> int:
        """Blocks of a sequence at `num_computed` that no query of it will read again: those
        wholly behind the window of its next query (one block of slack for drafts)."""
        return max(0, (num_computed - self.window + 1) // self.block_size - 1)

    def out_of_chunk(self, first_query: int) -> int:
        """Blocks no query from `first_query` on reads in chunked layers (chunks of `window`):
        those wholly before `first_query`'s chunk."""
        return first_query // self.window * self.window // self.block_size

    def release(
        self, block_ids: Sequence[int], start: int, end: int, refs: Callable[[int], int]
    ) -> int:
        """Mutates: a sequence holding `block_ids`, past its first `start` already, is past
        `block_ids[:end]` now; each block every holder is past gets spare pages. Returns how
        many leading blocks the sequence is past (its next `start`)."""
        for block in block_ids[start:end]:
            self.past[block] += 1
        self.settle(block_ids[start:end], refs)
        return max(start, end)

    def join(self, block_ids: Sequence[int]) -> None:
        """Mutates: a new holder of `block_ids` (a fork) is past them, as its parent is."""
        for block in block_ids:
            self.past[block] += 1

    def leave(self, block_ids: Sequence[int], past: int, refs: Callable[[int], int]) -> None:
        """Mutates: a holder of `block_ids`, past the first `past`, has let go of them (after
        the pool's decref); a block whose remaining holders are all past it (this one may
        have been the last not past it) gets spare pages."""
        for block in block_ids[:past]:
            self.past[block] -= 1
        self.settle(block_ids, refs)

    def settle(self, block_ids: Sequence[int], refs: Callable[[int], int]) -> None:
        """Mutates: the held blocks of `block_ids` that every holder is past get spare pages
        (a block no one holds was spared or taken back by the pool already)."""
        for block in block_ids:
            if 0 < refs(block) <= self.past[block]:
                self.spare(block, released=True)

    def check(self, refs: Sequence[int], cached: Sequence[bool]) -> None:
        """Raise IntegrityError unless every page unit belongs to one live block."""
        owned = [u for group in self.page_of for u in group if u >= 0]
        if len(set(owned)) != len(owned) or len(owned) != self.units_held:
            raise IntegrityError(f"{len(owned)} page units owned, {self.units_held} counted")
        if sorted(owned) != [u for u, page in enumerate(self.is_page) if page]:
            raise IntegrityError("page units disagree with the units marked as pages")
        for block in range(len(refs)):
            if self.page_of[0][block] >= 0 and refs[block] == 0 and not cached[block]:
                raise IntegrityError(f"free block {block} still holds window pages")
            if not 0 <= self.past[block] <= refs[block]:
                raise IntegrityError(
                    f"block {block}: {self.past[block]} holders past it, {refs[block]} holders"
                )


def layer_storage(
    num_blocks: int,
    block_size: int,
    shapes: list,
    window_layers: Sequence[int],
    window: int | None,
    free: deque[int],
    dtype,
    *,
    bits,
    group_size,
    chunk: int = 0,
    chunked: bool = False,
):
    """(K pools, V pools, WindowPages or None, layer -> page sub-group): each layer's storage.
    With window layers beside full-attention ones, all of one shape: as many arrays as there
    are full layers, each of `num_blocks` units, shared by a full layer and the window layers
    of its position in each sub-group. Otherwise one array per layer, no pages."""
    full = [i for i in range(len(shapes)) if i not in set(window_layers)]
    if not (window_layers and window is not None and full and len(set(shapes)) == 1):
        slots = [num_blocks * block_size] * len(shapes)
        return (*make_pools(slots, shapes, dtype, bits, group_size), None, {})
    per = len(full)
    groups = -(-len(window_layers) // per)
    pages = WindowPages(groups, free, num_blocks, window, block_size, chunk, chunked)
    array = {layer: j for j, layer in enumerate(full)}
    array.update({layer: t % per for t, layer in enumerate(window_layers)})
    k, v = make_pools([num_blocks * block_size] * per, shapes[:per], dtype, bits, group_size)
    shared_k = [k[array[i]] for i in range(len(shapes))]
    shared_v = [v[array[i]] for i in range(len(shapes))]
    return shared_k, shared_v, pages, {layer: t // per for t, layer in enumerate(window_layers)}
