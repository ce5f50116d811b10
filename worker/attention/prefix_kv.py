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
through that). At most `PREFIX_KV_BYTES` are kept, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict

import mlx.core as mx

PREFIX_KV_BYTES = 256 << 20  # kept gathered prefix K/V, all pools and layers together


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
    for row, blocks in enumerate(tables):
        node = root
        for block in blocks[: (lengths[row] - 1) // block_size]:
            node = node.children.setdefault(block, _Node())
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


class PrefixKV:
    """Gathered prefix K/V per (groups' blocks and versions, layer pool), least recently used
    first out past `budget` bytes. Layers fill an entry during the tick that makes it."""

    def __init__(self, budget: int = PREFIX_KV_BYTES) -> None:
        self.budget = budget
        self.entries: OrderedDict[tuple, dict[int, tuple]] = OrderedDict()
        self.blocks: dict[tuple, frozenset[int]] = {}
        self.nbytes = 0
        self.hits = self.misses = 0

    def forget_blocks(self, written: set[int]) -> None:
        """Drop every entry holding one of `written` (blocks a forward writes into)."""
        if not written or not self.entries:
            return
        for key in [k for k, blocks in self.blocks.items() if not blocks.isdisjoint(written)]:
            self._drop(key)

    def get(self, key: tuple, blocks: frozenset[int], pool, rows: mx.array):
        """The gathered `rows` of `pool` (packed for a quantized pool, as `pool.gather` gives
        them) kept under `key`, gathered now and kept when not there yet."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = {}
            self.blocks[key] = blocks
        self.entries.move_to_end(key)
        kept = entry.get(id(pool))
        if kept is not None:
            self.hits += 1
            return kept
        self.misses += 1
        kept = tuple(pool.gather(rows)) if hasattr(pool, "gather") else _gather(pool, rows)
        size = sum(a.nbytes for a in kept) if isinstance(kept, tuple) else kept.nbytes
        if size > self.budget:
            return kept
        while self.nbytes + size > self.budget and next(iter(self.entries)) != key:
            self._drop(next(iter(self.entries)))
        if self.nbytes + size <= self.budget:
            entry[id(pool)] = kept
            self.nbytes += size
        return kept

    def _drop(self, key: tuple) -> None:
        entry = self.entries.pop(key)
        del self.blocks[key]
        for kept in entry.values():
            self.nbytes -= sum(a.nbytes for a in kept) if isinstance(kept, tuple) else kept.nbytes


def forget_written(
    tables: list[list[int]], lengths: list[int], num_queries: int, block_size: int
) -> None:
    """Drop the kept prefixes holding a block this forward writes (each row's last
    `num_queries` positions, padding included: a superset)."""
    if not PREFIX_KV.entries:
        return
    written = set()
    for blocks, n in zip(tables, lengths, strict=True):
        written.update(blocks[max(0, n - num_queries) // block_size : (n - 1) // block_size + 1])
    PREFIX_KV.forget_blocks(written)


def _gather(pool: mx.array, rows: mx.array) -> mx.array:
    return pool.reshape(-1, pool.shape[-1])[rows]


PREFIX_KV = PrefixKV()  # the process's kept prefixes (keys hold allocation versions: unique)
