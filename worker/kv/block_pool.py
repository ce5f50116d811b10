"""Paged K/V storage: fixed-size blocks, a free list, ref counts, copy-on-write.

Storage, per layer, K and V each: an `mx.array` of shape
`(num_blocks * block_size, num_kv_heads, head_dim)`, a flat array of slots where
slot = block_id * block_size + offset (see docs/architecture.md for why); with `kv_bits` 8 or 4
a `QuantizedKV` of the same slots instead (packed values, scales, biases: worker/kv/quant.py).

Every block is in exactly one state:
- free: on the free list, ref count 0, not cached;
- held: ref count >= 1 (some sequence uses it); it may also be cached in the radix tree;
- cached-only: in the radix tree with ref count 0 (evictable).

The pool only keeps the books; the radix tree decides what is cached and when to evict.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import mlx.core as mx

from shared.config.choices import DEFAULT_BLOCK_SIZE, DEFAULT_KV_GROUP_SIZE
from worker.kv.errors import IntegrityError, KVCacheError, OutOfBlocksError
from worker.kv.memory import layers_bytes_per_block, num_blocks_for_budget
from worker.kv.quant import pool_arrays
from worker.kv.window_pages import layer_storage

logger = logging.getLogger(__name__)

# Called with cached blocks whose ref count crossed 0: held=True when they became held,
# held=False when they became cached-only. The radix tree listens to keep eviction exact.
HoldListener = Callable[[list[int], bool], None]

# Allocation numbers, unique in the process (across pools): see `BlockPool.versions`.
_ALLOCATIONS = itertools.count(1)


class PoolUsage(NamedTuple):
    free: int
    held: int
    cached_only: int


class BlockPool:
    """K/V blocks for every layer plus the books on who uses which block."""

    num_blocks_for_budget = staticmethod(num_blocks_for_budget)

    def __init__(
        self,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: mx.Dtype = mx.float16,
        kv_bits: int | None = None,
        kv_group_size: int | None = None,
        layer_shapes: Sequence[tuple[int, int, int, int]] | None = None,
        window_layers: Sequence[int] = (),
        window: int | None = None,
        window_chunk: int = 0,
        chunked: bool = False,
    ) -> None:
        """`layer_shapes`: per layer (K heads, K width, V heads, V width) where layers differ
        (MLA, two head dims). `window_layers` (widest window `window`, or `chunked`: chunks of
        it) beside full layers of one shape hold pages while they see them (window_pages)."""
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if value < (0 if name == "num_layers" else 1):  # 0: a model of recurrent layers only
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # None: unquantized, in `dtype` (the layout reported as 16 bits whatever the dtype)
        self.kv_bits = kv_bits if kv_bits is not None and kv_bits < 16 else None
        self.kv_group_size = (kv_group_size or DEFAULT_KV_GROUP_SIZE) if self.kv_bits else None
        same = (num_kv_heads, head_dim, num_kv_heads, head_dim)
        self.layer_shapes = list(layer_shapes or [same] * num_layers)
        if len(self.layer_shapes) != num_layers:
            raise ValueError(f"{len(self.layer_shapes)} layer shapes for {num_layers} layers")
        # every layer's K and V of one shape: what the disk tier and peer transfers carry
        self.uniform = all(s == same for s in self.layer_shapes)
        self._free = deque(range(num_blocks))  # oldest-freed first
        self.k, self.v, self.pages, self.window_group = layer_storage(
            num_blocks,
            block_size,
            self.layer_shapes,
            window_layers,
            window,
            self._free,
            dtype,
            bits=self.kv_bits,
            group_size=self.kv_group_size,
            chunk=window_chunk,
            chunked=chunked,
        )
        self.unit_cost = 1 + (self.pages.groups if self.pages else 0)  # units a new block takes
        mx.eval(self.k, self.v)  # reserve the memory now, not at the first forward pass
        self._refs = [0] * num_blocks
        self._cached = [False] * num_blocks
        self._hold_listener: HoldListener | None = None
        # Per block, the number of its latest allocation: (id, version) names one content of a
        # block once it is full (a held block's whole blocks never change; a freed one is
        # allocated anew before anything writes it), so attention may keep what it gathered.
        self.versions = [0] * num_blocks
        # copies on write made since `take_copies`, (source, copy): a tensor-parallel
        # follower makes them on its own shard of the pool before the next forward
        self._copies: list[tuple[int, int]] = []
        # bytes of one block in every layer (a token in every window; `nbytes`: the pool's)
        self.bytes_per_block = layers_bytes_per_block(
            block_size, self.layer_shapes, dtype, self.kv_bits, self.kv_group_size
        )
        # each storage array once (window layers share the full layers' arrays)
        self._arrays = list({id(a): a for p in (*self.k, *self.v) for a in pool_arrays(p)}.values())
        self.nbytes = sum(int(a.nbytes) for a in self._arrays)
        pages = f"; window layers in {self.pages.groups} page sub-groups" if self.pages else ""
        logger.info(
            "KV block pool: %d blocks x %d tokens (%d layers, %d KV heads, head dim %d, %s, "
            "%s)%s, %.1f MiB",
            num_blocks,
            block_size,
            num_layers,
            num_kv_heads,
            head_dim,
            dtype,
            self.kv_layout,
            pages,
            self.nbytes / 2**20,
        )

    # ---- queries (none of these mutate) ----

    @property
    def kv_layout(self) -> str:
        """How K/V are stored: "float16", or e.g. "q8g64" (8-bit values, groups of 64)."""
        if self.kv_bits is None:
            return str(self.dtype).rsplit(".", 1)[-1]
        return f"q{self.kv_bits}g{self.kv_group_size}"

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def num_free(self) -> int:
        """Blocks that could be allocated now (free units and spare pages, per block's cost)."""
        return self.room(0) // self.unit_cost

    def room(self, evictable: int) -> int:
        """Units free, spare or freed by evicting `evictable` cached blocks (a new block costs
        `unit_cost`; `units_for`: pages only for the blocks a window or a chunk sees)."""
        return len(self._free) + (self.pages.spare_units() if self.pages else 0) + evictable

    def units_for(self, blocks: int) -> int:
        return self.pages.units_alone(blocks) if self.pages else blocks

    def shortfall(self, num: int) -> int:
        """Cached blocks to evict before `num` blocks can be allocated (0: none)."""
        return max(0, num * self.unit_cost - self.room(0))

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # (the last one may be partial)

    def ref_count(self, block_id: int) -> int:
        return self._refs[self._checked_id(block_id)]

    def is_cached(self, block_id: int) -> bool:
        return self._cached[self._checked_id(block_id)]

    def is_free(self, block_id: int) -> bool:
        block_id = self._checked_id(block_id)
        page = self.pages is not None and self.pages.is_page[block_id]
        return self._refs[block_id] == 0 and not self._cached[block_id] and not page

    def can_allocate(self, num: int) -> bool:
        return num >= 0 and self.shortfall(num) == 0

    def can_cache(self, block_id: int) -> bool:
        """Whether `set_cached` would accept the block: held and not cached yet."""
        return self.ref_count(block_id) >= 1 and not self._cached[block_id]

    def needs_copy(self, block_id: int) -> bool:
        """Whether writing to this held block needs a private copy first (shared or cached)."""
        self._require_held(block_id)
        return self._refs[block_id] > 1 or self._cached[block_id]

    def can_copy_on_write(self, block_id: int) -> bool:
        return not self.needs_copy(block_id) or self.can_allocate(1)

    def usage(self) -> PoolUsage:
        """Blocks in each state, counted (O(num_blocks))."""
        held = sum(ref > 0 for ref in self._refs) + (self.pages.units_held if self.pages else 0)
        cached_only = sum(
            1 for ref, cached in zip(self._refs, self._cached, strict=True) if cached and not ref
        )
        return PoolUsage(len(self._free), held, cached_only)

    # ---- mutations ----

    def set_hold_listener(self, listener: HoldListener | None) -> None:
        """Mutates: the callback told when cached blocks become held or cached-only."""
        if listener is not None and self._hold_listener is not None:
            raise KVCacheError("this pool already has a hold listener (one radix cache per pool)")
        self._hold_listener = listener

    def allocate(self, num: int) -> list[int]:
        """Mutates: takes `num` free blocks (oldest-freed first), each with ref count 1."""
        if num < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num})")
        if not self.can_allocate(num):
            raise OutOfBlocksError(f"cannot allocate {num} blocks: only {self.num_free} free")
        if self.pages:
            self.pages.make_free(num * self.unit_cost)
        block_ids = [self._free.popleft() for _ in range(num)]
        for block_id in block_ids:
            self._refs[block_id] = 1
            self.versions[block_id] = next(_ALLOCATIONS)
            if self.pages:
                self.pages.give(block_id)
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Mutates: one more reference to each block (held or cached; never a free one)."""
        block_ids = list(block_ids)
        for block_id in block_ids:
            if self.is_free(block_id):
                raise KVCacheError(f"incref of free block {block_id}")
        became_held = []
        for block_id in block_ids:
            if self._refs[block_id] == 0:
                became_held.append(block_id)
            self._refs[block_id] += 1
        self._notify(became_held, held=True)

    def decref(self, block_ids: Iterable[int]) -> None:
        """Mutates: drops one reference per id; a block left unreferenced and uncached is freed.

        Raises (changing nothing) if any block would drop below zero: a double free.
        """
        block_ids = list(block_ids)
        for block_id, count in Counter(block_ids).items():
            if self.ref_count(block_id) < count:
                raise KVCacheError(
                    f"decref of block {block_id} {count} time(s) but its ref count is "
                    f"{self._refs[block_id]} (double free?)"
                )
        became_cached_only = []
        for block_id in block_ids:
            self._refs[block_id] -= 1
            if self._refs[block_id] == 0:
                self._release(block_id, became_cached_only)
        self._notify(became_cached_only, held=False)

    def set_cached(self, block_id: int) -> None:
        """Mutates: marks a held block as a member of the radix tree."""
        if not self.can_cache(block_id):
            raise KVCacheError(
                f"cannot cache block {block_id}: ref count {self._refs[block_id]}, "
                f"cached={self._cached[block_id]} (must be held and not cached)"
            )
        self._cached[block_id] = True

    def unset_cached(self, block_id: int) -> None:
        """Mutates: the tree lets go of a block; it is freed if no sequence holds it."""
        if not self.is_cached(block_id):
            raise KVCacheError(f"unset_cached of block {block_id}, which is not cached")
        self._cached[block_id] = False
        if self._refs[block_id] == 0:
            self._free.append(block_id)
            if self.pages:
                self.pages.take_back(block_id)

    def copy_on_write(self, block_id: int) -> int:
        """Mutates: a block the caller may write to, standing in for its held `block_id`.

        The same id when the caller is its only user and the tree does not have it; otherwise a
        new block with a copy of its K/V in every layer (quantized: packed values, scales and
        biases), and the caller's reference to the old block is dropped (the tree's copy never
        changes).
        """
        if not self.needs_copy(block_id):
            return block_id
        (new_id,) = self.allocate(1)
        self.copy_block(block_id, new_id)
        self.decref([block_id])
        self._copies.append((block_id, new_id))
        return new_id

    def take_copies(self) -> list[tuple[int, int]]:
        """Mutates: the copies on write made since the last call, (source, copy)."""
        copies, self._copies = self._copies, []
        return copies

    def copy_block(self, src_id: int, dst_id: int) -> None:
        """Mutates the storage only (no books): block `src_id`'s K/V into `dst_id`, every
        layer, as stored (quantized: packed values, scales and biases, never requantized).
        A tensor-parallel follower makes the leader's copies on write with it."""
        # Read the source into arrays of their own first: a write whose value still reads the
        # same pool makes MLX copy the whole pool (seconds for a big one), see write_kv. With
        # window pages, the units of the block and of each of its pages (a block without
        # pages has no window K/V a hit would read).
        units = [(src_id, dst_id)]
        if self.pages and self.pages.has_page(src_id) and self.pages.has_page(dst_id):
            units += list(zip(self.pages.pages(src_id), self.pages.pages(dst_id), strict=True))
        bs = self.block_size
        moves = [
            (a, slice(s * bs, (s + 1) * bs), slice(d * bs, (d + 1) * bs))
            for a in self._arrays
            for s, d in units
        ]
        copies = [mx.array(a[src]) for a, src, _ in moves]
        mx.eval(copies)
        for (array, _, dst), copy in zip(moves, copies, strict=True):
            array[dst] = copy

    # ---- integrity ----

    def check_integrity(self) -> PoolUsage:
        """Raise IntegrityError unless every block is in exactly one state; no mutation."""
        if any(ref < 0 for ref in self._refs):
            raise IntegrityError(f"negative ref counts: {self._negative_refs()}")
        free_set = set(self._free)
        if len(free_set) != len(self._free):
            dups = [b for b, n in Counter(self._free).items() if n > 1]
            raise IntegrityError(f"free list has duplicates: {dups}")
        expected_free = {b for b in range(self.num_blocks) if self.is_free(b)}
        if free_set != expected_free:
            raise IntegrityError(
                f"free list disagrees with block states: listed but in use "
                f"{sorted(free_set - expected_free)}, unused but not listed "
                f"{sorted(expected_free - free_set)}"
            )
        usage = self.usage()
        if sum(usage) != self.num_blocks:
            raise IntegrityError(f"free + held + cached-only = {sum(usage)} != {self.num_blocks}")
        if self.pages:
            self.pages.check(self._refs, self._cached)  # raises IntegrityError
        return usage

    # ---- helpers ----

    def _checked_id(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise KVCacheError(f"block id {block_id} out of range [0, {self.num_blocks})")
        return block_id

    def _require_held(self, block_id: int) -> None:
        if self.ref_count(block_id) < 1:
            raise KVCacheError(f"block {block_id} is not held by anyone")

    def _release(self, block_id: int, became_cached_only: list[int]) -> None:
        if self._cached[block_id]:
            became_cached_only.append(block_id)
            if self.pages:
                self.pages.spare(block_id)  # kept for hits, taken back first
        else:
            self._free.append(block_id)
            if self.pages:
                self.pages.take_back(block_id)

    def _notify(self, block_ids: Sequence[int], held: bool) -> None:
        if block_ids and self._hold_listener is not None:
            self._hold_listener(list(block_ids), held)

    def _negative_refs(self) -> dict[int, int]:
        return {b: ref for b, ref in enumerate(self._refs) if ref < 0}
