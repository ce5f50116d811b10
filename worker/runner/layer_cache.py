"""What one attention layer sees as its cache during one of our forwards.

mlx-lm's attention does rope(offset=cache.offset) -> cache.update_and_fetch(k, v) ->
attention over what that returned, with the mask the model made from `cache.make_mask`. A
`LayerCache` scatters the new K/V into the pool by slot id, then, by its layer's mode
(`worker.runner.layer_groups`):

- paged: returns the new K/V unchanged and answers `make_mask` with None; the patched
  `scaled_dot_product_attention` (`worker.attention.hook`) calls `attend`, which runs the
  forward's `AttentionPlan` over the pool;
- gathered: returns each row's visible span of K/V gathered from the pool (`GroupSpan`) and
  answers `make_mask` with that span's mask, so whatever attention the model computes (mlx-lm's
  own SDPA with sinks, soft-capping, MLA's absorbed form) runs as in mlx-lm.

A chunked layer (Llama 4) is gathered, and its mask is the span's whatever the model passes:
the model builds its chunk mask itself from `cache[0].start_position` and `offset`, one
sequence's positions (`worker.runner.row_ranges` lets it build one from ours, to be replaced:
`attention_mask`). `start_position` and `maybe_trim_front` are there for that code.

It also keeps the counts the load-time probe reads (the engine's `check_model`, at start-up).
A runner's slots, their modes and their places among mlx-lm's cache entries are one value it
is made with (`CacheLayout`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx

from worker.attention import AttentionBackend, AttentionPlan, PrefixKV, write_kv
from worker.kv.quant import rotate
from worker.runner.layer_groups import CHUNK, FULL, GroupSpan, LayerKind

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool


# A keys-only slot's values in the pool (`ModelShape.pool_shapes`): one head, one value wide
KEYS_ONLY_V = (1, 1)


class LayerTimes:
    """K/V write and attention time of one profiled forward (every layer evaluated apart)."""

    def __init__(self):
        self.write_s = 0.0
        self.attend_s = 0.0

    def timed(self, field: str, fn: Callable[[], mx.array | None], *inputs: mx.array):
        mx.eval(*inputs)  # what came before is not this phase's time
        start = time.perf_counter()
        result = fn()
        mx.eval(result if result is not None else [])
        setattr(self, field, getattr(self, field) + time.perf_counter() - start)
        return result


class LayerCache:
    """One layer's cache in one forward: `span` None is the paged mode, else gathered."""

    def __init__(
        self,
        pool: BlockPool,
        layer: int,
        offsets: mx.array,
        write_slots: mx.array,
        attention: AttentionPlan | None,
        span: GroupSpan | None = None,
        times: LayerTimes | None = None,
    ):
        self.pool, self.layer, self.offset = pool, layer, offsets
        self.write_slots, self.attention, self.span, self.times = (
            write_slots,
            attention,
            span,
            times,
        )
        # what the load-time probe reads
        self.writes = self.attends = self.shared_reads = 0
        self.window_sizes: list[int] = []  # windows asked of make_mask
        # per hook call: (mask ours, sinks given, K/V exactly as this cache fetched them)
        self.attended: list[tuple[bool, bool, bool]] = []
        self.shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # K, V as written
        self._fetched: tuple[mx.array, mx.array] | None = None
        # the pool keeps no values for this slot: the model hands it its keys as values
        self.keys_only = pool.layer_shapes[layer][2:] == KEYS_ONLY_V

    @property
    def gathered(self) -> bool:
        return self.span is not None

    # Models read a cache's `keys` and `values` and assign them: DeepSeek V3.2's indexer
    # `values = zeros_like(keys)`, and `keys = mx.depends(keys, ...)` to keep another cache's
    # write in the graph. They read what this cache fetched (None before); an assignment is
    # dropped: the pool holds the K/V, and the writes nothing reads are evaluated with the
    # step (`CacheEntries.unread_writes`).
    @property
    def keys(self) -> mx.array | None:
        return self._fetched[0] if self._fetched is not None else None

    @keys.setter
    def keys(self, value: mx.array) -> None:
        pass

    @property
    def values(self) -> mx.array | None:
        return self._fetched[1] if self._fetched is not None else None

    @values.setter
    def values(self, value: mx.array) -> None:
        pass

    @property
    def start_position(self) -> mx.array:
        """mlx-lm's `ChunkedKVCache.start_position` (its first kept key): here each row's
        first query, read only to build a chunk mask `attention_mask` replaces."""
        return self.offset

    def maybe_trim_front(self) -> None:
        """mlx-lm's `ChunkedKVCache` drops keys before the chunk; the pool keeps them (window
        pages release what every holder is past)."""

    def attention_mask(self, mask):
        """The mask this layer attends with, given the model's: a chunked layer's is the
        span's, always (the model's own is built from one sequence's position)."""
        if self.span is not None and self.span.chunk is not None:
            return self.span.mask
        return mask

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.writes += 1
        B, H, L, D = keys.shape
        Hv, Dv = values.shape[1], values.shape[3]
        self.shapes = ((H, D), (Hv, Dv))
        k, v = self.pool.k[self.layer], self.pool.v[self.layer]
        stored = rotate(keys) if self.pool.kv_bits else keys  # (worker/kv/quant.py)
        if self.keys_only and values is not keys:
            raise RuntimeError(f"cache slot {self.layer} was probed keys-only, given values")

        def write():
            rows = stored.swapaxes(1, 2).reshape(B * L, H, D)
            if self.keys_only:
                k[self.write_slots] = rows.astype(k.dtype)
                return [k]
            write_kv(k, v, self.write_slots, rows, values.swapaxes(1, 2).reshape(B * L, Hv, Dv))
            return [k, v]

        if self.times is None:
            write()
        else:
            self.times.timed("write_s", write, keys, values)
        if self.span is None:
            self._fetched = (keys, values)
        elif self.keys_only:
            gathered = self._gather(keys.dtype, values.dtype)[0]
            self._fetched = (gathered, gathered)
        else:
            self._fetched = self._gather(keys.dtype, values.dtype)
        return self._fetched

    def _gather(self, kdtype: mx.Dtype, vdtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Each row's span of K and V, `(B, H, width, D)`, in the layer's dtypes."""
        assert self.span is not None
        slots = self.span.slots
        k, v = self.pool.k[self.layer], self.pool.v[self.layer]
        keys = (k.take(slots) if hasattr(k, "take") else k[slots]).swapaxes(1, 2)
        values = (v.take(slots) if hasattr(v, "take") else v[slots]).swapaxes(1, 2)
        if self.pool.kv_bits:
            keys = rotate(keys)  # stored rotated; the rotation is its own inverse
        return keys.astype(kdtype), values.astype(vdtype)

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """What the latest `update_and_fetch` returned (KV-shared layers read it)."""
        self.shared_reads += 1
        if self._fetched is None:
            raise RuntimeError("keys_and_values before update_and_fetch in this forward")
        return self._fetched

    def make_mask(self, *args, window_size: int | None = None, **kwargs):
        if window_size is not None:
            self.window_sizes.append(window_size)
        if self.span is None:
            return None  # paged attention applies causality and lengths itself
        return self.span.mask_for(window_size)

    def attend(self, queries: mx.array, scale: float, sinks: mx.array | None = None):
        """Paged attention of `queries` over this layer's pool (the paged mode)."""
        assert self.attention is not None
        plan = self.attention
        k, v = self.pool.k[self.layer], self.pool.v[self.layer]
        queries = rotate(queries) if self.pool.kv_bits else queries  # as the stored keys
        if self.times is None:
            return plan(queries, k, v, scale=scale, sinks=sinks)
        return self.times.timed(
            "attend_s", lambda: plan(queries, k, v, scale=scale, sinks=sinks), queries
        )

    def note_attention(self, mask, sinks, keys=None, values=None) -> None:
        """The hook saw this cache's layer attend with `mask`, `sinks`, `keys`, `values`."""
        self.attends += 1
        made = self.span.made_masks() if self.span is not None else []
        ours = mask is None or any(mask is m for m in made)
        fetched = self._fetched or (None, None)
        as_fetched = keys is fetched[0] and values is fetched[1]
        self.attended.append((ours, sinks is not None, as_fetched))


class ForwardGroups:
    """One forward's per-group pieces, made once and shared by the group's layers: the
    attention plan of its paged layers and the span of its gathered ones. Window layers
    whose K/V live in window pages (`pool.pages`) read and write through `paged[g]`, the
    forward's layout over their sub-group's pages."""

    def __init__(
        self,
        pool: BlockPool,
        backend: AttentionBackend,
        layout,
        host_tables,
        paged,
        num_queries: int,
        grouped: bool,
        prefix_kv: PrefixKV | None = None,
    ):
        self.pool, self.backend, self.layout, self.paged = pool, backend, layout, paged
        self.host_tables, self.num_queries, self.grouped = host_tables, num_queries, grouped
        self.prefix_kv = prefix_kv  # the pool's kept prefixes, for its full layers' plans
        self._plans: dict[tuple, AttentionPlan] = {}
        self._spans: dict[tuple, GroupSpan] = {}

    def cache(self, layer: int, kind: LayerKind, gathered: bool, times) -> LayerCache:
        sub = self.pool.window_group.get(layer)  # its pages' sub-group, if it has pages
        layout = self.layout if sub is None else self.paged[sub]
        key = (kind, sub)
        plan = span = None
        if gathered:
            if key not in self._spans:
                same_kind = next((s for (k, _), s in self._spans.items() if k == kind), None)
                self._spans[key] = GroupSpan(
                    layout.block_tables,
                    layout.context_lengths,
                    self.num_queries,
                    self.pool.block_size,
                    kind.window,
                    self.grouped,
                    masks_of=same_kind,
                    chunk=kind.kind == CHUNK,
                )
            span = self._spans[key]
        else:
            if key not in self._plans:
                full = kind.kind == FULL and sub is None
                self._plans[key] = AttentionPlan(
                    self.backend,
                    layout.block_tables,
                    layout.context_lengths,
                    block_size=self.pool.block_size,
                    window=kind.window,
                    host_tables=self.host_tables if full else None,
                    prefix_kv=self.prefix_kv if full else None,
                )
            plan = self._plans[key]
        return LayerCache(self.pool, layer, layout.offsets, layout.write_slots, plan, span, times)


class CacheEntries(NamedTuple):
    """Where a forward's caches sit among mlx-lm's cache entries, when they are not one K/V
    slot each: `slot_map` (hybrids) per slot, K/V layer k >= 0 or state -1 - s; `sizes`,
    how many slots each entry is; `lists`, which entries are a `CacheList` (a state and
    attention; an indexer's keys beside MLA's; two attention blocks). Empty: as they come."""

    slot_map: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    lists: tuple[bool, ...] = ()

    def of(self, caches: list[LayerCache], states: list) -> list:
        """mlx-lm's cache list for the model, a CacheList entry given its members."""
        flat = [caches[k] if k >= 0 else states[-1 - k] for k in self.slot_map] or caches
        if not self.lists:
            return flat
        from mlx_lm.models.cache import CacheList

        entries, at = [], 0
        for size, listed in zip(self.sizes, self.lists, strict=True):
            entries.append(CacheList(*flat[at : at + size]) if listed else flat[at])
            at += size
        return entries

    def unread_writes(self, pool: BlockPool) -> list[mx.array]:
        """The pool arrays of K/V slots that share a CacheList with another K/V slot: an
        indexer's keys are written and not read while a context fits its top-k, and a write
        left pending grows the graph every step (mlx-lm's models `mx.depends` them so)."""
        flat = self.slot_map or range(len(pool.k))
        kv, at = [], 0
        for size in self.sizes:
            slots = [k for k in flat[at : at + size] if k >= 0]
            kv += slots if len(slots) > 1 else []
            at += size
        return [pool.k[k] for k in kv] + [pool.v[k] for k in kv]


@dataclass(frozen=True)
class CacheLayout:
    """A runner's cache slots, given when it is made (`ModelShape.layout`): each one's kind,
    its mode (True: it reads gathered K/V, else paged) and where the slots sit among mlx-lm's
    cache entries. Only the modes change afterwards, once, by the runner itself: the load-time
    probe runs every slot gathered, then settles the modes it found
    (`ModelRunner.probe`, `ModelRunner.settle_modes`)."""

    kinds: tuple[LayerKind, ...]
    gathered: tuple[bool, ...]
    entries: CacheEntries = CacheEntries()

    def __post_init__(self) -> None:
        if len(self.gathered) != len(self.kinds):
            raise ValueError(f"{len(self.kinds)} cache slots given {len(self.gathered)} modes")

    def with_modes(self, gathered) -> CacheLayout:
        """This layout with each slot's mode as `gathered` has it (True: gathered)."""
        return replace(self, gathered=tuple(gathered))
