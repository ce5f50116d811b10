"""Which one-query rows share which prefix, and the prefix K/V kept across ticks.

`group_rows`: a trie over the rows' block ids, settled bottom-up: each row reads its prefix from
at most one group, the deepest run of whole blocks it shares with other rows unless folding
that group into a shallower one reads fewer blocks. A group of m rows over d blocks saves
(m - 1) * d block reads; the grouping maximises that greedily (tenants behind one common tool
preamble that diverge later get a group each, or one group over the preamble when that saves
more).

`PrefixKV`: the gathered prefix K/V of a step's groups, per layer, kept from one tick to the
next under the groups' blocks and their versions (`BlockPool.versions`, bumped each time a
block is allocated, so a freed and reused block never matches). A block a forward writes is
dropped from every entry on the spot (a pool without versions, a TP follower's, stays exact
through that). One per pool, owned by the runner that reads it, made with its budget (the
worker's memory plan's share, else `PREFIX_KV_BYTES`), least recently used first out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import NamedTuple

import mlx.core as mx

from worker.attention.mlx_ops import context_slot_table

PREFIX_KV_BYTES = 256 << 20  # kept gathered prefix K/V of a pool, all layers, when not sized


class _Node:
    __slots__ = ("children", "ends")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.ends: list[int] = []


def group_rows(
    tables: list[list[int]], lengths: list[int], block_size: int
) -> list[tuple[list[int], int]]:
    """Groups `(rows, depth in blocks)` of rows that read their first `depth` blocks from one
    gathered prefix; rows in no group read their whole context on their own. A row's prefix
    stops before the block of its last key (every row keeps its own key after its prefix)."""
    root = _Node()
    # rows over one table (a folded prefill chunk: hundreds of rows, one sequence's blocks)
    # walk its path once, each ending at its depth: rows x blocks would cost seconds at 20k
    by_table: dict[int, list[int]] = {}
    for row, blocks in enumerate(tables):
        by_table.setdefault(id(blocks), []).append(row)
    for rows in by_table.values():
        blocks = tables[rows[0]]
        node, at = root, 0
        for row in sorted(rows, key=lambda r: lengths[r]):
            depth = min((lengths[row] - 1) // block_size, len(blocks))
            for block in blocks[at:depth]:
                node = node.children.setdefault(block, _Node())
            at = max(at, depth)
            node.ends.append(row)
    groups: list[tuple[list[int], int]] = []
    # iterative post-order: (node, depth, loose rows passed up, candidate groups passed up)
    stack: list[tuple[_Node, int, bool]] = [(root, 0, False)]
    results: list[tuple[list[int], list[tuple[list[int], int]]]] = []
    while stack:
        node, depth, done = stack.pop()
        if not done:
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in node.children.values())
            continue
        loose, found = list(node.ends), []
        for _ in node.children:
            child_loose, child_found = results.pop()
            loose += child_loose
            found += child_found
        if depth == 0:
            groups = [(sorted(rows), d) for rows, d in found]
            break
        results.append(_settle(loose, found, depth))
    return groups


def _settle(loose: list[int], found: list[tuple[list[int], int]], depth: int):
    """At a node `depth` blocks deep: open a group there for the loose rows and every group
    below that gains by moving up (m * depth > (m - 1) * its depth), when that saves reads."""
    gains = [len(rows) * depth - (len(rows) - 1) * d for rows, d in found]
    moved = [g for g, gain in zip(found, gains, strict=True) if gain > 0]
    saving = (len(loose) - 1) * depth + sum(gain for gain in gains if gain > 0)
    if saving <= 0 or len(loose) + sum(len(rows) for rows, _ in moved) < 2:
        return loose, found
    rows = loose + [r for g, _ in moved for r in g]
    stay = [g for g, gain in zip(found, gains, strict=True) if gain <= 0]
    return [], [*stay, (rows, depth)]


class KeptPrefixes(NamedTuple):
    """A step's group prefixes as `PrefixKV` keeps them: stacked, the entry a tick reads (all
    the groups' keys together; one group: its own entry). A group that comes or goes costs a
    new stack built from views of the last one and a gather of the new group's prefix only."""

    groups: tuple  # per group: its key, ((block, version), ...); all of them: the stack's
    blocks: tuple  # per group: its block ids
    block_size: int
    num_kv_heads: int
    forward: int  # which forward's plan: what it kept is not dropped for room during it


class PrefixKV:
    """Gathered prefix K/V per key (a step's groups stacked, or one group's blocks and versions)
    and layer pool, least recently used first out past `budget` bytes. Layers fill an entry
    during the tick that makes it. What a forward reads is not dropped to make room during
    that forward: when its prefixes outgrow the budget, the first layers' stay kept and the
    last layers' are gathered each tick (dropping the oldest would drop the next layer's,
    which would gather everything every tick). `hits` / `misses`: group prefixes served from
    what is kept / gathered from the pool.

    `versions`: the pool's `BlockPool.versions` (read, never written: the pool bumps them), so
    one store keeps the prefixes of one pool's layers."""

    def __init__(self, versions: list[int], budget: int = PREFIX_KV_BYTES) -> None:
        self.versions, self.budget = versions, budget
        self.entries: OrderedDict[tuple, dict[int, tuple]] = OrderedDict()
        self.blocks: dict[tuple, frozenset[int]] = {}
        self.used: dict[tuple, int] = {}  # the last forward that read each entry
        # (group, pool) -> (the last stack kept with it, its index there)
        self.stacks: dict[tuple, tuple[tuple, int]] = {}
        self.nbytes = 0
        self.hits = self.misses = 0
        self._forwards = itertools.count()  # numbers the forwards' plans (`KeptPrefixes`)

    def kept(self, prefixes, block_size: int, num_kv_heads: int) -> KeptPrefixes:
        """One forward's group prefixes (each its block ids) as this store keeps them: under
        their blocks and the blocks' versions now."""
        groups = tuple(tuple((b, self.versions[b]) for b in p) for p in prefixes)
        blocks = tuple(tuple(p) for p in prefixes)
        return KeptPrefixes(groups, blocks, block_size, num_kv_heads, next(self._forwards))

    def forget_written(
        self, tables: list[list[int]], lengths: list[int], num_queries: int, block_size: int
    ) -> None:
        """Drop the kept prefixes holding a block this forward writes (each row's last
        `num_queries` positions, padding included: a superset)."""
        if not self.entries:
            return
        written = set()
        for blocks, n in zip(tables, lengths, strict=True):
            written.update(
                blocks[max(0, n - num_queries) // block_size : (n - 1) // block_size + 1]
            )
        self.forget_blocks(written)

    def forget_blocks(self, written: set[int]) -> None:
        """Drop every entry holding one of `written` (blocks a forward writes into)."""
        if not written or not self.entries:
            return
        for key in [k for k, blocks in self.blocks.items() if not blocks.isdisjoint(written)]:
            self._drop(key)

    def get(self, kept: KeptPrefixes, pool, width: int):
        """The groups' prefixes of `pool` (packed for a quantized pool, as `pool.gather` gives
        them), `(Hkv, G, width, ...)`, each padded to `width` keys: the stacked entry when
        kept, else stacked anew from what is kept of each group, gathering the rest."""
        if len(kept.groups) == 1:  # the group's own entry, viewed as a stack of one
            return _map(lambda a: a[:, None], self._group(kept, 0, pool, keep=True))
        stacked = self._kept(kept.groups, pool, kept.forward)
        if stacked is not None:
            self.hits += len(kept.groups)
            return stacked
        pieces = [self._group(kept, g, pool, keep=False) for g in range(len(kept.groups))]
        if isinstance(pieces[0], tuple):  # packed values, scales and biases
            stacked = tuple(
                mx.stack([_pad(p[i], width) for p in pieces], axis=1) for i in range(len(pieces[0]))
            )
        else:
            stacked = mx.stack([_pad(p, width) for p in pieces], axis=1)
        blocks = frozenset(b for group in kept.blocks for b in group)
        self._keep(kept.groups, blocks, pool, stacked, kept.forward)
        self.stacks.update(((key, id(pool)), (kept.groups, g)) for g, key in enumerate(kept.groups))
        return stacked

    def _group(self, kept: KeptPrefixes, g: int, pool, keep: bool):
        """Group `g`'s prefix of `pool`, `(Hkv, depth * block_size, ...)`: its own entry, or a
        view of the last stack kept with it, or gathered (and kept on its own if `keep`)."""
        key, blocks = kept.groups[g], kept.blocks[g]
        length = len(blocks) * kept.block_size
        got = self._kept(key, pool, kept.forward)
        if got is None:
            got = self._from_stack(key, pool, length)
        if got is not None:
            self.hits += 1
            return got
        self.misses += 1
        table = mx.array([blocks], dtype=mx.int32)
        slots = context_slot_table(table, length, kept.block_size)  # (1, length)
        rows = slots * kept.num_kv_heads + mx.arange(kept.num_kv_heads, dtype=mx.int32)[:, None]
        got = tuple(pool.gather(rows)) if hasattr(pool, "gather") else _gather(pool, rows)
        if keep:
            self._keep(key, frozenset(blocks), pool, got, kept.forward)
        return got

    def _from_stack(self, key: tuple, pool, length: int):
        """Group prefix `key` as a view of the last stack kept with it, without marking that
        stack read: the stack that replaces it may drop it for room."""
        where = self.stacks.get((key, id(pool)))
        entry = self.entries.get(where[0]) if where is not None else None
        stacked = entry.get(id(pool)) if entry is not None else None
        if stacked is None:
            return None
        return _map(lambda a: a[:, where[1], :length], stacked)

    def _kept(self, key: tuple, pool, forward: int):
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.entries.move_to_end(key)
        self.used[key] = forward
        return entry.get(id(pool))

    def _keep(self, key: tuple, blocks: frozenset[int], pool, value, forward: int) -> None:
        """Keep `value` under (`key`, `pool`) where it fits, dropping for room the least
        recently used entries that this forward has not read."""
        size = _nbytes(value)
        if size > self.budget:
            return
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = {}
            self.blocks[key] = blocks
        self.entries.move_to_end(key)
        self.used[key] = forward
        while (
            self.nbytes + size > self.budget
            and self.used[oldest := next(iter(self.entries))] != forward
        ):
            self._drop(oldest)
        if self.nbytes + size <= self.budget:
            entry[id(pool)] = value
            self.nbytes += size

    def _drop(self, key: tuple) -> None:
        entry = self.entries.pop(key)
        del self.blocks[key], self.used[key]
        self.stacks = {group: at for group, at in self.stacks.items() if at[0] != key}
        for kept in entry.values():
            self.nbytes -= _nbytes(kept)


def _nbytes(value) -> int:
    return sum(a.nbytes for a in value) if isinstance(value, tuple) else value.nbytes


def _map(fn, value):
    return tuple(fn(a) for a in value) if isinstance(value, tuple) else fn(value)


def _pad(a: mx.array, width: int) -> mx.array:
    """`a` `(Hkv, keys, ...)` zero-padded to `width` keys (the plan masks the padding)."""
    if a.shape[1] == width:
        return a
    return mx.pad(a, [(0, 0), (0, width - a.shape[1])] + [(0, 0)] * (a.ndim - 2))


def _gather(pool: mx.array, rows: mx.array) -> mx.array:
    return pool.reshape(-1, pool.shape[-1])[rows]
